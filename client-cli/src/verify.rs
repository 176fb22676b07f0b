//! `ephem-batch verify JOB`: every claim of the job's receipt, checked against what this client
//! sealed and opened. Each check is named; the first failures are what an operator needs.
//!
//! The receipt object is read once ([`fetch_receipt`]) and verified before any of its fields is
//! used: the host can swap it between two reads.
//!
//! | check | what |
//! |---|---|
//! | `receipt` | the committed receipt exists and decodes |
//! | `receipt_attestation` | the attestation document it names: chain to the policy's root at the document's own time, the policy's PCRs, the key binding, the receipt signature by the bound key, fleet key and PCRs consistent |
//! | `job_id`, `model`, `options`, `result_key`, `fleet_key`, `records` | the receipt states what the client sealed |
//! | `input_sha256` | the sealed input the enclave read is the one this client uploaded |
//! | `output_sha256` | the sealed output this client downloaded (and wrote) is the one the enclave wrote: same attempt, same SHA-256 |
//! | `record_ids` | the output's record ids are the ids this client sealed, in order |
//! | `commitment` | the keyed plaintext commitment: the enclave saw exactly this plaintext and produced exactly this output |
//! | `ledger` | the ledger holds this receipt, byte for byte, with an inclusion proof against a checkpoint signed by the ledger key: for a deployment, the job's own proof object (`jobs/<id>/ledger-proof.json`), else the home's synced copy of the ledger; the checkpoint carries the configured witnesses' quorum (`witness_quorum`, `witness_cosignature`; without witnesses the detail says it is signed by the operator's key only) and is consistent with the largest checkpoint of the ledger this client accepted before (`fork`, `rollback`, `consistency`), which it then records |

use anyhow::anyhow;
use cloud::{layout, ObjectError, Services};
use protocol::envelope::{JobId, ResultSecretKey};
use protocol::receipt::{PlaintextCommitment, Receipt};
use receipts_ledger::local::LocalLedger;
use protocol::receipt_check::ReceiptVerifier;
use receipts_ledger::VerifierKey;
use serde::Serialize;

use crate::backend::LedgerSource;
use crate::ledger::Refusal;
use crate::home::Home;
use crate::jobstate::{ClientJob, Downloaded, JobFiles};
use crate::trust::ClientTrust;

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub passed: bool,
    pub detail: String,
}

#[derive(Debug, Serialize)]
pub struct Verification {
    pub job_id: JobId,
    pub development_root: bool,
    pub checks: Vec<Check>,
    /// When the `ledger` check failed because what the ledger showed is refused (not because
    /// the entry is not there yet): the refusal's check (`witness_quorum`, `fork`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ledger_refusal: Option<&'static str>,
}

impl Verification {
    pub fn passed(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|c| c.passed)
    }

    pub fn failures(&self) -> Vec<&Check> {
        self.checks.iter().filter(|c| !c.passed).collect()
    }

    pub fn new(job: &JobId, trust: &ClientTrust) -> Self {
        Verification { job_id: *job, development_root: trust.development, checks: Vec::new(), ledger_refusal: None }
    }

    pub fn add(&mut self, name: &'static str, passed: bool, detail: impl Into<String>) -> bool {
        self.checks.push(Check { name, passed, detail: detail.into() });
        passed
    }

    pub fn print(&self) {
        for check in &self.checks {
            let mark = if check.passed { "ok  " } else { "FAIL" };
            println!("{mark}  {:20} {}", check.name, check.detail);
        }
        if self.passed() {
            let dev = if self.development_root { " (DEVELOPMENT root)" } else { "" };
            println!("verified{dev}");
        }
    }
}

/// A receipt read once and verified against the policy: the bytes checked are the bytes used.
#[derive(Debug, Clone)]
pub struct VerifiedReceipt {
    pub bytes: Vec<u8>,
    pub receipt: Receipt,
}

/// What reading the committed receipt gave (failures recorded in the [`Verification`]).
pub enum Fetched {
    Verified(VerifiedReceipt),
    /// None committed: the job has not completed.
    Missing,
    /// It does not decode or does not verify.
    Refused,
}

/// Reads the committed receipt once and verifies it (`receipt`, `receipt_attestation`).
pub fn fetch_receipt(services: &Services, trust: &ClientTrust, job: &JobId, out: &mut Verification) -> anyhow::Result<Fetched> {
    let bytes = match services.jobs.get_at_most(&layout::job_receipt(job), cloud::MAX_SMALL_OBJECT) {
        Ok(bytes) => bytes,
        Err(ObjectError::NotFound { .. }) => {
            out.add("receipt", false, "no receipt committed (the job has not completed)");
            return Ok(Fetched::Missing);
        }
        Err(error) => return Err(error.into()),
    };
    let signed = match protocol::receipt::SignedReceipt::decode(&bytes) {
        Ok(signed) => signed,
        Err(error) => {
            out.add("receipt", false, error.to_string());
            return Ok(Fetched::Refused);
        }
    };
    out.add("receipt", true, format!("{} bytes, attempt {}", bytes.len(), signed.receipt.attempt));
    let document_key = layout::attestation_by_hash(&signed.receipt.attestation_sha256);
    let document = match services.attestations.get_at_most(&document_key, cloud::MAX_SMALL_OBJECT) {
        Ok(document) => document,
        Err(ObjectError::NotFound { .. }) => {
            out.add("receipt_attestation", false, format!("the attestation document it names is not published ({document_key})"));
            return Ok(Fetched::Refused);
        }
        Err(error) => return Err(error.into()),
    };
    let checker = ReceiptVerifier::new(trust.policy.root.clone())
        .with_expected_pcrs(trust.policy.pcrs.clone())
        .allow_debug(trust.policy.allow_debug);
    match checker.verify(&bytes, &document) {
        Ok(verified) => {
            let pcr0 = verified.receipt.pcrs.get(&0).map(hex::encode).unwrap_or_default();
            out.add(
                "receipt_attestation",
                true,
                format!("signed by the receipt key bound in {} (PCR0 {}…)", verified.module_id, pcr0.get(..16).unwrap_or(&pcr0)),
            );
            Ok(Fetched::Verified(VerifiedReceipt { bytes, receipt: verified.receipt }))
        }
        Err(error) => {
            out.add("receipt_attestation", false, format!("check `{}` failed: {error}", error.check()));
            Ok(Fetched::Refused)
        }
    }
}

/// Runs every check. `downloaded` is what was opened (and written) before, if anything: it
/// defaults to the job state's; with neither, the output the receipt names is opened here
/// (nothing written).
pub fn verify_job(
    home: &Home,
    services: &Services,
    trust: &ClientTrust,
    job: &JobId,
    result_key: &ResultSecretKey,
    downloaded: Option<Downloaded>,
) -> anyhow::Result<Verification> {
    let files = JobFiles::new(home, &job.to_hex());
    let state: ClientJob = files.load()?;
    let mut out = Verification::new(job, trust);
    let Fetched::Verified(verified) = fetch_receipt(services, trust, job, &mut out)? else {
        return Ok(out);
    };
    let receipt = &verified.receipt;
    check_sealed(&state, job, receipt, &mut out);
    // What was written is what is checked: a different attempt fails `output_sha256` below.
    let downloaded = match downloaded.or(state.downloaded.clone()) {
        Some(d) => Ok(d),
        None => crate::opening::open_output(services, job, receipt.attempt, result_key, Some(state.records), None, |_| Ok(())),
    };
    match downloaded {
        Ok(downloaded) => check_output(&files, &state, receipt, &downloaded, &mut out),
        Err(error) => unopened_output(job, receipt.attempt, &error, &mut out),
    }
    check_ledger(home, services, trust, job, &verified.bytes, &mut out);
    Ok(out)
}

/// The receipt states what the client sealed: `job_id`, `model`, `options`, `result_key`,
/// `fleet_key`, `records`, `input_sha256`. Needs no output, so it runs before any is read.
pub fn check_sealed(state: &ClientJob, job: &JobId, receipt: &Receipt, out: &mut Verification) {
    let hex = hex::encode;
    out.add("job_id", receipt.job_id == *job, format!("receipt names {}", receipt.job_id));
    out.add(
        "model",
        receipt.model_id == state.model_id && hex(receipt.manifest_hash) == state.manifest_hash,
        format!("{} manifest {}", receipt.model_id, hex(receipt.manifest_hash)),
    );
    let options = &receipt.options;
    out.add(
        "options",
        options.truncate == state.truncate
            && options.normalize == state.normalize
            && options.dtype.as_str() == state.dtype
            && options.precision.as_str() == state.precision
            && options.prompt == state.prompt
            && options.dimensions == state.dimensions
            && options.ranges.as_ref().map(crate::ranges::sha256_hex) == state.ranges_sha256
            && options.output.as_str() == state.output.as_deref().unwrap_or("dense")
            && options.top_k == state.top_k
            && options.max_record_bytes == state.max_record_bytes,
        format!(
            "{} {} truncate={} normalize={} prompt={} dimensions={}",
            options.precision.as_str(),
            options.dtype.as_str(),
            options.truncate,
            options.normalize,
            options.prompt.as_deref().unwrap_or("none"),
            options.dimensions.map_or("model's".to_owned(), |d| d.to_string())
        ) + &options.ranges.as_ref().map(|r| format!(" ranges={}", &crate::ranges::sha256_hex(r)[..16])).unwrap_or_default()
            + &match (options.output, options.top_k) {
                (protocol::envelope::OutputKind::Dense, _) => String::new(),
                (protocol::envelope::OutputKind::Sparse, top_k) => format!(" output=sparse top_k={}", top_k.map_or("all".to_owned(), |k| k.to_string())),
                (protocol::envelope::OutputKind::MultiVector, _) => {
                    format!(" output=multivector max_record_bytes={}", options.max_record_bytes.map_or("none".to_owned(), |b| b.to_string()))
                }
                (kind, _) => format!(" output={}", kind.as_str()),
            }
            + &receipt.compute.as_ref().map(compute_detail).unwrap_or_default(),
    );
    out.add("result_key", hex(receipt.result_key_id) == state.result_key_id, format!("sealed to key {}", hex(receipt.result_key_id)));
    out.add(
        "fleet_key",
        hex(receipt.fleet_key_id) == state.fleet_key_id && receipt.epoch == state.epoch,
        format!("epoch {} key {}", receipt.epoch, hex(receipt.fleet_key_id)),
    );
    out.add(
        "records",
        receipt.records_ok + receipt.records_failed == state.records,
        format!("{} embedded + {} failed of {} sealed, {} tokens", receipt.records_ok, receipt.records_failed, state.records, receipt.tokens),
    );
    out.add("input_sha256", hex(receipt.input_sha256) == state.sealed_sha256, hex(receipt.input_sha256));
}

/// How a bf16 or int8 job computed, as its receipt states (`compute`): "; int8 on avx512, bf16
/// on avx512; 12 records of at most 8 tokens at bf16".
fn compute_detail(compute: &protocol::receipt::Compute) -> String {
    let units: Vec<String> = [("int8", compute.int8), ("bf16", compute.bf16)]
        .into_iter()
        .filter_map(|(arithmetic, unit)| unit.map(|unit| format!("{arithmetic} on {}", unit.as_str())))
        .collect();
    let short = compute.short.map(|s| {
        format!("; {} records of at most {} tokens at {}", s.records, s.max_tokens, s.precision.as_str())
    });
    format!("; {}{}", units.join(", "), short.unwrap_or_default())
}

/// The opened output against the verified receipt and the sealed ids: `output_sha256`,
/// `record_ids`, `commitment`.
pub fn check_output(files: &JobFiles, state: &ClientJob, receipt: &Receipt, downloaded: &Downloaded, out: &mut Verification) {
    let hex = hex::encode;
    let detail = if downloaded.attempt == receipt.attempt {
        hex(receipt.output_sha256)
    } else {
        format!("the output opened is attempt {}, the verified receipt names attempt {}", downloaded.attempt, receipt.attempt)
    };
    let same = downloaded.attempt == receipt.attempt && hex(receipt.output_sha256) == downloaded.sealed_sha256;
    out.add("output_sha256", same, detail);
    let ids = match (&state.ids_sha256, &downloaded.ids_sha256) {
        (Some(sealed), Some(opened)) if sealed == opened => (true, "the ids sealed, in order".to_owned()),
        (Some(_), Some(_)) => (false, "the output's record ids are not the ids sealed, in order".to_owned()),
        (None, _) => (false, "the job state keeps no commitment to the ids sealed (submitted by an older client)".to_owned()),
        (_, None) => (false, "the ids of the output opened were not recorded (opened by an older client: run `results` again)".to_owned()),
    };
    out.add("record_ids", ids.0, ids.1);
    let commitment = match (decode32(&state.plaintext_sha256), decode32(&downloaded.plaintext_sha256), files.commitment_key()) {
        (Some(input), Some(output), Ok(key)) => PlaintextCommitment::from_digests(&key, &input, &output) == receipt.commitment,
        _ => false,
    };
    out.add("commitment", commitment, "keyed commitment to the input and output plaintext");
}

/// An output object that does not open is not the output the receipt names.
pub fn unopened_output(job: &JobId, attempt: u64, error: &anyhow::Error, out: &mut Verification) {
    out.add("output_sha256", false, format!("{} does not open: {error:#}", layout::job_output(job, attempt)));
}

/// The key a deployment's ledger is pinned to: `EPHEM_LEDGER_KEY` (the key string or a file
/// holding it), else the key the home's copy was synced under before (`ledger sync
/// --ledger-key`, or the development key `dev up --backend aws` pinned). Never a key the bucket or
/// a proof object supplies.
fn deployment_ledger_key(bucket: &str, copy: &std::path::Path) -> anyhow::Result<VerifierKey> {
    match std::env::var("EPHEM_LEDGER_KEY").ok().filter(|v| !v.is_empty()) {
        Some(arg) => Ok(crate::ledger::parse_ledger_key(&arg)?.key),
        None => LocalLedger::verifier_key(copy).map_err(|e| {
            anyhow!(
                "no ledger key pinned for the ledger in {bucket} ({e}): set EPHEM_LEDGER_KEY, or run \
                 `ephem-batch --backend aws ledger sync --from s3://{bucket} --ledger-key KEY` once"
            )
        }),
    }
}

/// Brings the home's copy of a deployment's ledger up to its bucket, checking every checkpoint
/// against `key`.
fn sync_deployment_ledger(bucket: &str, objects: std::sync::Arc<dyn cloud::ObjectStore>, copy: &std::path::Path, key: &VerifierKey) -> anyhow::Result<()> {
    match crate::ledger::sync_copy(copy, objects, "", key)? {
        Ok(_) => Ok(()),
        Err(e) => Err(anyhow!("the ledger in {bucket} refused: {e}")),
    }
}

fn decode32(text: &str) -> Option<[u8; 32]> {
    hex::decode(text).ok()?.try_into().ok()
}

/// How long a check of the home's own ledger waits for the witnesses to cosign a checkpoint
/// that covers the job: the embedded default's runtime submits each checkpoint to them just after
/// signing it, and a job is marked ledgered in between.
const WITNESS_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// The ledger holds the receipt, proven against a checkpoint signed by the ledger key that
/// carries the witness quorum configured (`trust.witnesses`) and is consistent with every
/// checkpoint of this ledger this client accepted before (`crate::ledger::job_check`). A
/// deployment's job is checked with its own proof object when there is one (a refused one fails
/// the check, naming why), with consistency proofs from the ledger bucket's hash tiles; without
/// one, with the synced copy. A refusal sets [`Verification::ledger_refusal`].
pub fn check_ledger(home: &Home, services: &Services, trust: &ClientTrust, job: &JobId, receipt: &[u8], out: &mut Verification) {
    let policy = trust.witnesses.as_ref();
    let result = (|| -> anyhow::Result<Result<String, Refusal>> {
        let (dir, source, grace) = match crate::backend::ledger_source() {
            LedgerSource::Home => (home.ledger_dir(), "the home's ledger".to_owned(), WITNESS_GRACE),
            LedgerSource::Bucket { name, objects, copy } => {
                let key = deployment_ledger_key(name, copy)?;
                let proof = layout::job_ledger_proof(job);
                let checked = crate::ledger::check_job_proof_object(services.jobs.as_ref(), objects.as_ref(), "", copy, job, receipt, &key, policy)?;
                match checked {
                    Some(Ok(entry)) => return Ok(Ok(entry.describe(&proof))),
                    Some(Err(r)) => return Ok(Err(Refusal { check: r.check, message: format!("the ledger proof {proof} is refused: {}", r.message) })),
                    None => {}
                }
                sync_deployment_ledger(name, objects.clone(), copy, &key)?;
                (copy.clone(), format!("the home's copy of the ledger in {name}"), std::time::Duration::ZERO)
            }
            LedgerSource::Unnamed => {
                return Err(anyhow!("the AWS settings name no ledger bucket (EPHEM_LEDGER_BUCKET / LedgerBucketName)"));
            }
        };
        let pinned = LocalLedger::verifier_key(&dir)?;
        let deadline = std::time::Instant::now() + grace;
        loop {
            match crate::ledger::check_job_in_ledger(&dir, job, receipt, &pinned, policy)? {
                Err(r) if r.check == "witness_quorum" && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                checked => return Ok(checked.map(|entry| entry.describe(&source))),
            }
        }
    })();
    match result {
        Ok(Ok(detail)) => out.add("ledger", true, detail),
        Ok(Err(refusal)) => {
            out.ledger_refusal = Some(refusal.check);
            out.add("ledger", false, format!("{}: {}", refusal.check, refusal.message))
        }
        Err(error) => out.add("ledger", false, error.to_string()),
    };
}
