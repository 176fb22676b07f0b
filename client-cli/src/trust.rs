//! What the client trusts, and the checks that turn a published attestation document into a
//! fleet key to seal to (DESIGN.md §4, §5 step 1).
//!
//! Trust comes from a policy file signed by the enclave image's publisher, whose key the client
//! pins. For the embedded default, `ephem-batch dev up` writes a development policy (development
//! root, the local worker binary's PCR0) signed by a development publisher key; every command
//! that relies on it says so loudly.

use std::path::PathBuf;

use anyhow::{anyhow, Context};
use clap::Args;
use cloud::{layout, ObjectError, Services};
use ed25519_dalek::VerifyingKey;
use protocol::attestation::{
    self, AttestationDocument, GenesisError, Policy, SignedPolicy, UserDataBinding, VerifiedDocument, VerifyOptions,
};
use protocol::fleet::{genesis_object_key, EpochGenesis};
use protocol::envelope::FleetPublicKey;
use protocol::kms_arn::KmsKeyArn;

use crate::fleet_key::memory::KeyMemory;
use crate::home::Home;

#[derive(Args, Debug, Clone, Default)]
pub struct TrustArgs {
    /// Attestation policy file (JSON, signed by the image publisher). Default: the development
    /// policy of `ephem-batch dev up`.
    #[arg(long, value_name = "FILE", env = "EPHEM_POLICY")]
    pub policy: Option<PathBuf>,
    /// The image publisher's Ed25519 public key (64 hex digits) the policy must be signed with.
    #[arg(long, value_name = "HEX", env = "EPHEM_PUBLISHER_KEY")]
    pub publisher_key: Option<String>,
    /// The model publisher's Ed25519 public key (64 hex digits) manifests must be signed with.
    /// Default: the development model publisher (embedded default only).
    #[arg(long, value_name = "HEX", env = "EPHEM_MODEL_PUBLISHER_KEY")]
    pub model_publisher_key: Option<String>,
    /// A fleet KMS key (a key ARN) the binding must name, beside the genesis every fleet key
    /// must have. Default: the stack outputs' FleetKeyArn, or the home's local fleet key — a
    /// consistency check only: an operator-written name is never what makes a key trusted.
    #[arg(long, value_name = "ARN", env = "EPHEM_FLEET_KEY_ARN")]
    pub fleet_key_arn: Option<String>,
    /// The witnesses whose cosignatures a job's ledger checkpoint must carry (`verify`, `results`,
    /// `submit --wait`, `bulk results|verify`), as for `ledger verify`.
    #[command(flatten)]
    pub witness: crate::witness_args::WitnessArgs,
}

/// The verified policy and the keys the client pins.
pub struct ClientTrust {
    pub policy: Policy,
    pub policy_file: PathBuf,
    pub model_publisher: VerifyingKey,
    pub development: bool,
    /// A fleet KMS key the binding must name, if one is given or the backend names one (a
    /// consistency check: trust in a fleet key comes from its genesis).
    pub fleet_kms_key: Option<KmsKeyArn>,
    /// What this client accepted about each fleet KMS key.
    pub key_memory: KeyMemory,
    /// The witness quorum a job's ledger checkpoint must carry (`--witness`, `--witness-quorum`,
    /// `EPHEM_WITNESSES`); `None`: the checkpoint is signed by the operator's key only.
    pub witnesses: Option<receipts_ledger::WitnessPolicy>,
}

/// An Ed25519 public key given as 64 hex digits; `what` names it in errors.
pub fn parse_key(hex_key: &str, what: &str) -> anyhow::Result<VerifyingKey> {
    let bytes: [u8; 32] = hex::decode(hex_key.trim())
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| anyhow!("{what} must be 64 hex digits"))?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| anyhow!("{what} is not an Ed25519 public key"))
}

impl ClientTrust {
    pub fn load(home: &Home, args: &TrustArgs) -> anyhow::Result<ClientTrust> {
        let (policy_file, publisher_hex) = match (&args.policy, &args.publisher_key) {
            (Some(file), Some(key)) => (file.clone(), key.clone()),
            (Some(_), None) => return Err(anyhow!("--policy needs --publisher-key: a policy is only as good as its signer")),
            (None, _) => {
                let file = home.dev_policy();
                let key = std::fs::read_to_string(home.dev_image_publisher_pub()).map_err(|_| {
                    anyhow!("no attestation policy: pass --policy and --publisher-key, or run `ephem-batch dev up` for the embedded default")
                })?;
                (file, args.publisher_key.clone().unwrap_or(key))
            }
        };
        let text = std::fs::read_to_string(&policy_file).with_context(|| format!("reading policy {}", policy_file.display()))?;
        let signed = SignedPolicy::from_json(&text).with_context(|| format!("policy {}", policy_file.display()))?;
        let publisher = parse_key(&publisher_hex, "the image publisher key")?;
        let policy = signed.verify(&publisher).with_context(|| format!("policy {}", policy_file.display()))?.clone();
        let development = policy.root.kind() != attestation::RootKind::AwsNitroG1;
        // The public development publisher signs only for the development root: a custom root
        // is someone's real deployment, whose models must come from its own publisher.
        let model_publisher = match &args.model_publisher_key {
            Some(key) => parse_key(key, "--model-publisher-key")?,
            None if policy.root.kind() == attestation::RootKind::Development => {
                protocol::manifest::development_publisher().verifying_key()
            }
            None => return Err(anyhow!("--model-publisher-key is required unless the policy trusts the development root")),
        };
        let fleet_kms_key = match &args.fleet_key_arn {
            Some(text) => Some(text.parse::<KmsKeyArn>().context("--fleet-key-arn")?),
            None => crate::backend::fleet_kms_key(),
        };
        let witnesses = args.witness.policy().context("the witness settings")?;
        Ok(ClientTrust { policy, policy_file, model_publisher, development, fleet_kms_key, key_memory: KeyMemory::of(home), witnesses })
    }

    /// The deployment's fleet KMS key, or why there is none.
    pub fn pinned_fleet_kms_key(&self) -> anyhow::Result<&KmsKeyArn> {
        self.fleet_kms_key.as_ref().ok_or_else(|| {
            anyhow!(
                "no fleet KMS key to pin: pass --fleet-key-arn (EPHEM_FLEET_KEY_ARN) or --stack-outputs \
                 (FleetKeyArn), or run `ephem-batch dev up` for the embedded default"
            )
        })
    }

    /// Options for a document whose fleet key the client is about to seal to: everything of
    /// [`options_now`](Self::options_now), and, if a fleet KMS key is named, the binding must
    /// name it (a name that differs is refused by `fleet_kms_key`, never followed).
    pub fn options_for_sealing(&self, now_ms: u64) -> anyhow::Result<VerifyOptions> {
        let mut options = self.options_now(now_ms);
        options.expected_fleet_kms_key = self.fleet_kms_key.clone();
        Ok(options)
    }

    /// Options for an epoch's genesis document: the policy, at the document's own time (an epoch
    /// lives for days, its genesis certificate for hours); its `user_data` is a genesis binding,
    /// which `attestation::check_genesis` reads.
    pub fn options_for_genesis(&self, document: &[u8]) -> VerifyOptions {
        let at = AttestationDocument::parse_unverified(document).map(|d| d.timestamp_ms).unwrap_or(0);
        self.policy.verify_options(at)
    }

    /// Says loudly when the trust is only a development root.
    pub fn warn_if_development(&self) {
        if self.development {
            eprintln!(
                "WARNING: DEVELOPMENT attestation root ({}): the enclave is a local development worker, \
                 not AWS Nitro hardware; nothing here is confidential from this machine's owner",
                self.policy.root.label()
            );
        }
    }

    /// Options for a document a client is about to trust now.
    pub fn options_now(&self, now_ms: u64) -> VerifyOptions {
        let mut options = self.policy.verify_options(now_ms);
        options.require_binding = true;
        options
    }

    /// Options for the document a receipt names, checked at that document's own time (its
    /// leaf certificate lives about three hours; the receipt is evidence for much longer).
    pub fn options_at_document_time(&self, document: &[u8]) -> VerifyOptions {
        let at = AttestationDocument::parse_unverified(document).map(|d| d.timestamp_ms).unwrap_or(0);
        self.options_now(at)
    }
}

/// A published document that verified, with the keys it binds.
pub struct PublishedEnclave {
    pub key: String,
    pub document: Vec<u8>,
    pub verified: VerifiedDocument,
    pub binding: UserDataBinding,
    pub fleet: FleetPublicKey,
}

/// The freshest published document that passes every check of the policy. When none does, the
/// error names each document's failed check.
pub fn current_enclave(services: &Services, trust: &ClientTrust, now_ms: u64) -> anyhow::Result<PublishedEnclave> {
    let listed = services.attestations.list(layout::ATTESTATIONS_CURRENT_PREFIX)?;
    if listed.is_empty() {
        return Err(anyhow!("no enclave has published an attestation document yet (is the fleet running? `ephem-batch dev status`)"));
    }
    let mut best: Option<PublishedEnclave> = None;
    let mut failures = Vec::new();
    for meta in listed {
        let document = match services.attestations.get_at_most(&meta.key, cloud::MAX_SMALL_OBJECT) {
            Ok(bytes) => bytes,
            Err(ObjectError::NotFound { .. }) => continue,
            Err(error) => return Err(error.into()),
        };
        match check_published(services, &document, trust, now_ms) {
            Ok((verified, binding, fleet)) => {
                let newer = best.as_ref().is_none_or(|b| verified.document.timestamp_ms > b.verified.document.timestamp_ms);
                if newer {
                    best = Some(PublishedEnclave { key: meta.key, document, verified, binding, fleet });
                }
            }
            Err(error) => failures.push(format!("{}: {error}", meta.key)),
        }
    }
    best.ok_or_else(|| anyhow!("no published attestation document passes the policy:\n  {}", failures.join("\n  ")))
}

/// A published document, and the fleet key it binds, as a client may seal to it: the document
/// passes the policy now; the epoch is current and no longer than an epoch may be; the epoch's
/// genesis — an enclave of the same policy saying KMS generated the key for it under a key that
/// releases only to the image — vouches for exactly this key; and the key's evidence is what this
/// client accepted before for the same KMS key.
fn check_published(
    services: &Services,
    document: &[u8],
    trust: &ClientTrust,
    now_ms: u64,
) -> anyhow::Result<(VerifiedDocument, UserDataBinding, FleetPublicKey)> {
    let verified = attestation::verify(document, &trust.options_for_sealing(now_ms)?)?;
    let binding = verified.binding.clone().ok_or_else(|| anyhow!("check `user_data_binding` failed: no binding"))?;
    attestation::check_epoch_lifetime(&binding, verified.document.timestamp_ms, now_ms)?;
    let genesis = epoch_genesis(services, binding.epoch)?;
    let born = attestation::check_genesis(&genesis, &binding, &trust.options_for_genesis(&genesis.document_bytes()?))?;
    trust.key_memory.accept(&born.kms_key, &born.evidence_digest, now_ms)?;
    let fleet = FleetPublicKey::from_bytes(&binding.fleet_public_key).map_err(|e| anyhow!("bound fleet key: {e}"))?;
    Ok((verified, binding, fleet))
}

/// Largest genesis read (a document and a key policy: a few KiB each).
const MAX_GENESIS_LEN: u64 = 256 * 1024;

/// The stored genesis of `epoch` (`fleet_key_genesis` when there is none).
fn epoch_genesis(services: &Services, epoch: u64) -> Result<EpochGenesis, GenesisError> {
    match services.attestations.get_at_most(&genesis_object_key(epoch), MAX_GENESIS_LEN) {
        Ok(bytes) => EpochGenesis::from_json(&bytes).map_err(|e| GenesisError::Unreadable(e.to_string())),
        Err(ObjectError::NotFound { .. }) => Err(GenesisError::Missing(epoch)),
        Err(error) => Err(GenesisError::Unreadable(error.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use protocol::attestation::TrustAnchor;

    use super::*;

    /// A P-384 root that is neither AWS's nor a development one: a real document's forged root.
    fn custom_root() -> TrustAnchor {
        let fixtures = std::env::var_os("EPHEM_FIXTURES")
            .map(PathBuf::from)
            .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures").into());
        let bytes = std::fs::read(fixtures.join("nitro-attestation/negative/neg_forged_root.cbor")).expect("fixture");
        let document = AttestationDocument::parse_unverified(&bytes).unwrap();
        TrustAnchor::from_der(&document.cabundle[0]).unwrap()
    }

    fn load_with_root(root: TrustAnchor) -> anyhow::Result<ClientTrust> {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::resolve(Some(dir.path())).unwrap();
        let publisher = ed25519_dalek::SigningKey::from_bytes(&[4; 32]);
        let pcrs = BTreeMap::from([(0, vec![0xab; 48]), (1, vec![0xa1; 48]), (2, vec![0xa2; 48])]);
        let policy = Policy { root, pcrs, allow_debug: false, max_age_s: 3600 };
        let file = dir.path().join("policy.json");
        std::fs::write(&file, policy.sign(&publisher).unwrap().to_json()).unwrap();
        let args = TrustArgs {
            policy: Some(file),
            publisher_key: Some(hex::encode(publisher.verifying_key().to_bytes())),
            ..TrustArgs::default()
        };
        ClientTrust::load(&home, &args)
    }

    #[test]
    fn only_the_development_root_falls_back_to_the_public_development_model_publisher() {
        let root = custom_root();
        assert_eq!(root.kind(), attestation::RootKind::Other);
        let error = load_with_root(root).err().expect("a custom root without --model-publisher-key is refused");
        assert!(error.to_string().contains("--model-publisher-key"), "{error}");
        let error = load_with_root(TrustAnchor::aws_nitro_g1()).err().expect("refused");
        assert!(error.to_string().contains("--model-publisher-key"), "{error}");
        let issuer = protocol::attestation::DevIssuer::from_seed(&[1; 32], 0).unwrap();
        let trust = load_with_root(issuer.trust_anchor().unwrap()).unwrap();
        assert_eq!(trust.model_publisher, protocol::manifest::development_publisher().verifying_key());
    }
}
