//! `ephem-batch attest …`: verify Nitro attestation documents.
//!
//! Exit status of `attest verify`: 0 valid, 1 invalid (the failed check is named on stderr),
//! 2 usage or I/O error.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow};
use clap::{Args, Subcommand};
use protocol::attestation::{
    AttestationDocument, Report, RootKind, SignedPolicy, TrustAnchor, VerifyOptions, format_ms, verify_report,
};
use serde::Serialize;

#[derive(Subcommand)]
pub enum AttestCommand {
    /// Verify an attestation document (raw CBOR COSE_Sign1) and report every check by name.
    Verify(VerifyArgs),
    /// Fetch the fleet's current published document (or a fresh one carrying a nonce), verify it
    /// against the policy, and save it.
    Fetch(FetchArgs),
}

#[derive(Args)]
pub struct FetchArgs {
    /// Ask an enclave for a fresh document carrying this nonce (hex, up to 498 bytes).
    #[arg(long, value_name = "HEX", value_parser = parse_nonce)]
    pub nonce: Option<Nonce>,
    /// Where to save the document (raw CBOR).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub trust: crate::trust::TrustArgs,
}

#[derive(Args)]
pub struct VerifyArgs {
    /// The attestation document: raw binary CBOR, as the NSM returns it.
    pub file: PathBuf,

    /// Trust this root (a PEM certificate file) instead of the AWS Nitro Enclaves root G1
    /// (or the policy's root).
    #[arg(long, value_name = "PEM")]
    pub root: Option<PathBuf>,

    /// Verification time: RFC 3339 (2023-06-06T14:02:47Z), milliseconds since the UNIX epoch,
    /// or `doc` for the document's own timestamp (how an auditor checks an old document).
    /// Default: this machine's clock.
    #[arg(long, value_name = "RFC3339|UNIX_MS|doc")]
    pub at: Option<String>,

    /// Policy file (JSON): root, PCRs, allow_debug, max_age_s, publisher signature.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,

    /// The image publisher's Ed25519 public key (64 hex characters): the policy's signature
    /// must verify with it. Without it the policy is used unverified, with a warning.
    #[arg(long, value_name = "HEX", env = "EPHEM_PUBLISHER_KEY", requires = "policy")]
    pub publisher_key: Option<String>,

    /// Expect PCR N to equal HEX exactly (repeatable; adds to or overrides the policy).
    #[arg(long = "expect-pcr", value_name = "N=HEX", value_parser = parse_pcr)]
    pub expect_pcr: Vec<(u8, Vec<u8>)>,

    /// Accept a debug-mode enclave (PCR0/1/2 all zero).
    #[arg(long)]
    pub allow_debug: bool,

    /// Expect this nonce (hex).
    #[arg(long, value_name = "HEX", value_parser = parse_nonce)]
    pub nonce: Option<Nonce>,

    /// Require user_data to be an ephem-batch key binding (fleet key, receipt key, epoch,
    /// not_after, KMS key).
    #[arg(long)]
    pub binding: bool,

    /// Require the binding to name this KMS key ARN (the deployment's fleet key; implies
    /// --binding): check `fleet_kms_key`.
    #[arg(long, value_name = "ARN")]
    pub fleet_key_arn: Option<protocol::kms_arn::KmsKeyArn>,

    /// Maximum document age in seconds (default: the policy's, else 3600).
    #[arg(long, value_name = "SECONDS")]
    pub max_age: Option<u64>,

    /// Print every check and the decoded fields as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}


/// A nonce given on the command line (a newtype so clap takes it as one value).
#[derive(Clone, Debug)]
pub struct Nonce(pub Vec<u8>);

fn parse_nonce(s: &str) -> Result<Nonce, String> {
    parse_hex(s).map(Nonce)
}

fn parse_hex(s: &str) -> Result<Vec<u8>, String> {
    hex::decode(s.trim()).map_err(|e| format!("not hex: {e}"))
}

fn parse_pcr(s: &str) -> Result<(u8, Vec<u8>), String> {
    let (index, value) = s.split_once('=').ok_or("expected N=HEX")?;
    let index: u8 = index.trim().parse().map_err(|_| format!("PCR index {index:?} is not a number"))?;
    if index > 31 {
        return Err(format!("PCR index {index} is outside 0..=31"));
    }
    let value = parse_hex(value)?;
    if ![32, 48, 64].contains(&value.len()) {
        return Err(format!("PCR{index} value is {} bytes; a PCR is 32, 48 or 64 bytes", value.len()));
    }
    Ok((index, value))
}

/// Parses `--at`: RFC 3339 or UNIX milliseconds (`doc` is handled by the caller).
fn parse_at(s: &str) -> anyhow::Result<u64> {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().with_context(|| format!("--at {s}: out of range"));
    }
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .with_context(|| format!("--at {s:?}: neither RFC 3339, UNIX milliseconds nor `doc`"))?;
    let ms = t.unix_timestamp_nanos() / 1_000_000;
    u64::try_from(ms).map_err(|_| anyhow!("--at {s}: before 1970"))
}

fn clock_ms() -> anyhow::Result<u64> {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).context("system clock is before 1970")?;
    u64::try_from(d.as_millis()).context("system clock out of range")
}

struct PolicyUse {
    file: PathBuf,
    signature_verified: bool,
}

pub fn verify(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let bytes = std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;

    let now_ms = match args.at.as_deref() {
        None => clock_ms()?,
        // An unparsable document has no timestamp: verify at the clock, the report names the failure.
        Some("doc") => match AttestationDocument::parse_unverified(&bytes) {
            Ok(doc) => doc.timestamp_ms,
            Err(_) => clock_ms()?,
        },
        Some(at) => parse_at(at)?,
    };

    let mut policy_use = None;
    let mut options = match &args.policy {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let signed = SignedPolicy::from_json(&text).with_context(|| format!("policy {}", path.display()))?;
            let verified = match &args.publisher_key {
                Some(key) => {
                    let key: [u8; 32] = hex::decode(key.trim())
                        .ok()
                        .and_then(|k| k.try_into().ok())
                        .ok_or_else(|| anyhow!("--publisher-key must be 32 bytes of hex"))?;
                    signed.verify_with_key_bytes(&key).with_context(|| format!("policy {}", path.display()))?;
                    true
                }
                None => {
                    eprintln!(
                        "WARNING: policy {} is used WITHOUT checking its publisher signature (no --publisher-key)",
                        path.display()
                    );
                    false
                }
            };
            policy_use = Some(PolicyUse { file: path.clone(), signature_verified: verified });
            signed.policy.verify_options(now_ms)
        }
        None => VerifyOptions::aws(now_ms),
    };
    if let Some(path) = &args.root {
        let pem = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        options.root = TrustAnchor::from_pem(&pem).with_context(|| format!("root {}", path.display()))?;
    }
    for (index, value) in &args.expect_pcr {
        options.expected_pcrs.insert(*index, value.clone());
    }
    options.allow_debug |= args.allow_debug;
    if let Some(max_age) = args.max_age {
        options.max_age_s = max_age;
    }
    options.expected_nonce = args.nonce.as_ref().map(|n| n.0.clone());
    options.require_binding = args.binding;
    options.expected_fleet_kms_key = args.fleet_key_arn.clone();

    match options.root.kind() {
        RootKind::AwsNitroG1 => {}
        RootKind::Development => eprintln!(
            "WARNING: trusting a DEVELOPMENT root ({}), not the AWS Nitro Enclaves root G1: \
             a document that verifies here proves nothing about Nitro hardware",
            options.root.label()
        ),
        RootKind::Other => eprintln!(
            "WARNING: trusting {}, which is NOT the AWS Nitro Enclaves root G1",
            options.root.label()
        ),
    }
    if options.expected_pcrs.is_empty() {
        eprintln!("note: no expected PCRs (--policy or --expect-pcr): the enclave's measurements are not checked");
    }

    let report = verify_report(&bytes, &options);
    if args.json {
        let out = JsonReport::new(&report, policy_use.as_ref());
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_human(&report);
    }
    match report.error() {
        None => Ok(ExitCode::SUCCESS),
        Some(error) => {
            eprintln!("invalid: {error}");
            Ok(ExitCode::from(1))
        }
    }
}

fn print_human(report: &Report) {
    let width = report.checks.iter().map(|c| c.name.as_str().len()).max().unwrap_or(0).max(17);
    for check in &report.checks {
        let mark = if check.passed { "ok  " } else { "FAIL" };
        println!("{mark}  {:width$}  {}", check.name.as_str(), clean(&check.detail));
    }
    for name in report.not_evaluated() {
        println!("--    {:width$}  not evaluated", name.as_str());
    }
    if let Some(doc) = &report.document {
        println!();
        if !report.is_valid() {
            println!("decoded fields (NOT trusted: verification failed)");
        }
        println!("module_id   {}", clean(&doc.module_id));
        println!("timestamp   {} ({} ms)", format_ms(doc.timestamp_ms), doc.timestamp_ms);
        for (index, value) in &doc.pcrs {
            if value.iter().any(|b| *b != 0) || *index <= 2 {
                println!("PCR{index:<2}       {}", hex::encode(value));
            }
        }
        println!("public_key  {}", len_text(doc.public_key.as_deref()));
        println!("user_data   {}", len_text(doc.user_data.as_deref()));
        println!("nonce       {}", len_text(doc.nonce.as_deref()));
    }
    if let Some(binding) = report.verified().and_then(|v| v.binding.as_ref()) {
        println!("epoch       {} until {}", binding.epoch, format_ms(binding.not_after_ms));
        println!("fleet key   {} (released by KMS key {})", hex::encode(binding.fleet_key_id()), binding.kms_key);
    }
    println!("root        {}", report.root.label);
    println!("verified at {}", format_ms(report.verified_at_ms));
    if report.is_valid() {
        let dev = if report.root.is_development() { " (DEVELOPMENT root)" } else { "" };
        println!("valid{dev}");
    }
}

/// Escapes control characters: document text is attacker-chosen until verified, and must not
/// drive the terminal.
fn clean(text: &str) -> String {
    if text.chars().any(char::is_control) { text.escape_debug().to_string() } else { text.to_owned() }
}

fn len_text(field: Option<&[u8]>) -> String {
    match field {
        None => "null".to_owned(),
        Some(v) => format!("{} bytes", v.len()),
    }
}

#[derive(Serialize)]
struct JsonReport {
    valid: bool,
    error: Option<JsonError>,
    verified_at_ms: u64,
    verified_at: String,
    root: JsonRoot,
    policy: Option<JsonPolicy>,
    checks: Vec<JsonCheck>,
    not_evaluated: Vec<&'static str>,
    document: Option<JsonDocument>,
    binding: Option<JsonBinding>,
}

#[derive(Serialize)]
struct JsonError {
    check: &'static str,
    message: String,
}

#[derive(Serialize)]
struct JsonRoot {
    kind: &'static str,
    label: String,
    subject: String,
    sha256: String,
    aws_nitro_g1: bool,
    development: bool,
}

#[derive(Serialize)]
struct JsonPolicy {
    file: String,
    signature_verified: bool,
}

#[derive(Serialize)]
struct JsonCheck {
    name: &'static str,
    passed: bool,
    detail: String,
}

#[derive(Serialize)]
struct JsonDocument {
    module_id: String,
    timestamp_ms: u64,
    timestamp: String,
    digest: String,
    pcrs: BTreeMap<u8, String>,
    public_key_len: Option<usize>,
    user_data_len: Option<usize>,
    nonce_len: Option<usize>,
    cabundle_len: usize,
}

#[derive(Serialize)]
struct JsonBinding {
    fleet_public_key: String,
    fleet_key_id: String,
    receipt_public_key: String,
    receipt_key_id: String,
    epoch: u64,
    not_after_ms: u64,
    not_after: String,
    kms_key_arn: String,
}

impl JsonReport {
    fn new(report: &Report, policy: Option<&PolicyUse>) -> JsonReport {
        let binding = report.verified().and_then(|v| v.binding.as_ref()).map(|b| JsonBinding {
            fleet_public_key: hex::encode(b.fleet_public_key),
            fleet_key_id: hex::encode(b.fleet_key_id()),
            receipt_public_key: hex::encode(b.receipt_public_key),
            receipt_key_id: hex::encode(b.receipt_key_id()),
            epoch: b.epoch,
            not_after_ms: b.not_after_ms,
            not_after: format_ms(b.not_after_ms),
            kms_key_arn: b.kms_key.to_string(),
        });
        JsonReport {
            valid: report.is_valid(),
            error: report.error().map(|e| JsonError { check: e.check().as_str(), message: e.reason() }),
            verified_at_ms: report.verified_at_ms,
            verified_at: format_ms(report.verified_at_ms),
            root: JsonRoot {
                kind: report.root.kind.as_str(),
                label: report.root.label.clone(),
                subject: report.root.subject.clone(),
                sha256: hex::encode(report.root.sha256),
                aws_nitro_g1: report.root.kind == RootKind::AwsNitroG1,
                development: report.root.is_development(),
            },
            policy: policy.map(|p| JsonPolicy {
                file: p.file.display().to_string(),
                signature_verified: p.signature_verified,
            }),
            checks: report
                .checks
                .iter()
                .map(|c| JsonCheck { name: c.name.as_str(), passed: c.passed, detail: c.detail.clone() })
                .collect(),
            not_evaluated: report.not_evaluated().into_iter().map(|n| n.as_str()).collect(),
            document: report.document.as_ref().map(|d| JsonDocument {
                module_id: d.module_id.clone(),
                timestamp_ms: d.timestamp_ms,
                timestamp: format_ms(d.timestamp_ms),
                digest: d.digest.clone(),
                pcrs: d.pcrs.iter().map(|(i, v)| (*i, hex::encode(v))).collect(),
                public_key_len: d.public_key.as_ref().map(Vec::len),
                user_data_len: d.user_data.as_ref().map(Vec::len),
                nonce_len: d.nonce.as_ref().map(Vec::len),
                cabundle_len: d.cabundle.len(),
            }),
            binding,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A nonce whose hex cannot name an S3 key is refused before anything is written (S3 would
    /// refuse the request object; a host could never answer it).
    #[test]
    fn a_nonce_too_long_for_a_request_key_is_refused_before_any_write() {
        let dir = tempfile::tempdir().unwrap();
        let services = cloud_local::LocalCloud::open(dir.path()).unwrap().services();
        let error = fresh_document(&services, &[7; cloud::layout::MAX_REQUEST_NONCE_LEN + 1]).unwrap_err().to_string();
        assert!(error.contains("1 to 498 bytes"), "{error}");
        assert!(services.attestations.list(cloud::layout::ATTESTATION_REQUESTS_PREFIX).unwrap().is_empty());
    }

    #[test]
    fn clap_definition_is_consistent() {
        use clap::{CommandFactory, Parser};
        #[derive(Parser)]
        struct Wrapper {
            #[command(subcommand)]
            command: AttestCommand,
        }
        Wrapper::command().debug_assert();
        let w = Wrapper::try_parse_from(["x", "verify", "f", "--nonce", "0011", "--expect-pcr", &format!("3={}", "aa".repeat(32))]).unwrap();
        let AttestCommand::Verify(args) = w.command else { panic!("parsed as another subcommand") };
        assert_eq!(args.nonce.unwrap().0, vec![0, 0x11]);
        assert_eq!(args.expect_pcr, vec![(3, vec![0xaa; 32])]);
    }

    #[test]
    fn at_parsing() {
        assert_eq!(parse_at("1686060167435").unwrap(), 1686060167435);
        assert_eq!(parse_at("2023-06-06T14:02:47.435Z").unwrap(), 1686060167435);
        assert_eq!(parse_at("2023-06-06T16:02:47.435+02:00").unwrap(), 1686060167435);
        assert!(parse_at("yesterday").is_err());
        assert!(parse_at("1969-12-31T23:59:59Z").is_err());
    }

    #[test]
    fn pcr_parsing() {
        assert_eq!(parse_pcr(&format!("8={}", "00".repeat(48))).unwrap(), (8, vec![0; 48]));
        assert!(parse_pcr("8").is_err());
        assert!(parse_pcr("32=00").is_err());
        assert!(parse_pcr(&format!("0={}", "00".repeat(47))).is_err());
        assert!(parse_pcr("x=00").is_err());
    }
}

/// How long `attest fetch --nonce` waits for an enclave's answer.
const FRESH_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// `attest fetch`: the current document from the attestations store, or a fresh one for a nonce
/// (a request object the hosts answer through their enclave), verified against the policy.
pub fn fetch(home: &crate::home::Home, services: &cloud::Services, args: &FetchArgs) -> anyhow::Result<ExitCode> {
    let trust = crate::trust::ClientTrust::load(home, &args.trust)?;
    trust.warn_if_development();
    let now = clock_ms()?;
    let document = match &args.nonce {
        None => crate::trust::current_enclave(services, &trust, now)?.document,
        Some(nonce) => {
            let document = fresh_document(services, &nonce.0)?;
            let mut options = trust.options_for_sealing(clock_ms()?)?;
            options.expected_nonce = Some(nonce.0.clone());
            protocol::attestation::verify(&document, &options).context("the fresh document")?;
            document
        }
    };
    let mut options = trust.options_for_sealing(clock_ms()?)?;
    options.expected_nonce = args.nonce.as_ref().map(|n| n.0.clone());
    let report = verify_report(&document, &options);
    if let Some(path) = &args.output {
        std::fs::write(path, &document).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        let policy_use = PolicyUse { file: trust.policy_file.clone(), signature_verified: true };
        println!("{}", serde_json::to_string_pretty(&JsonReport::new(&report, Some(&policy_use)))?);
    } else {
        print_human(&report);
        if let Some(path) = &args.output {
            println!("saved       {}", path.display());
        }
    }
    Ok(if report.is_valid() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn fresh_document(services: &cloud::Services, nonce: &[u8]) -> anyhow::Result<Vec<u8>> {
    let max = cloud::layout::MAX_REQUEST_NONCE_LEN;
    if nonce.is_empty() || nonce.len() > max {
        return Err(anyhow!("--nonce must be 1 to {max} bytes: its hex names the request object, and S3 keys hold at most {} bytes", cloud::layout::MAX_KEY_LEN));
    }
    let request = cloud::layout::attestation_request(nonce);
    let answer = cloud::layout::attestation_fresh(nonce);
    // The key names the nonce; the body only dates the request (hosts read at most 1 KiB of it).
    let body = serde_json::json!({ "requested_ms": clock_ms()? });
    match services.attestations.put(&request, body.to_string().as_bytes(), cloud::PutCondition::CreateOnly) {
        Ok(_) | Err(cloud::ObjectError::AlreadyExists { .. }) => {}
        Err(error) => return Err(error.into()),
    }
    let deadline = std::time::Instant::now() + FRESH_WAIT;
    loop {
        match services.attestations.get_at_most(&answer, cloud::MAX_SMALL_OBJECT) {
            Ok(document) => return Ok(document),
            Err(cloud::ObjectError::NotFound { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            Err(cloud::ObjectError::NotFound { .. }) => {
                return Err(anyhow!("no enclave answered the attestation request within {}s", FRESH_WAIT.as_secs()));
            }
            Err(error) => return Err(error.into()),
        }
    }
}
