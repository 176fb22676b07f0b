//! The attestation policies receipts must satisfy before `ledger-append` appends them or
//! `bulk-aggregate` counts them: every object under a prefix of the artifacts bucket (the
//! policy file `enclave-image/build-enclave.sh` writes, one per image the fleet may run —
//! the old and the new one during a rotation), each signed by the image publisher whose key
//! the deployment pins.
//!
//! Environment: `EPHEM_IMAGE_PUBLISHER_KEY` (64 hex digits), `EPHEM_POLICIES_BUCKET`, and
//! optionally `EPHEM_POLICIES_PREFIX` (default [`DEFAULT_PREFIX`]) and `EPHEM_IMAGE_PCR0S` (the
//! PCR0 of each image the fleet runs or is about to run, comma-separated hex). A function without
//! them, with no policy, with one that does not verify, or with a named image no policy admits
//! refuses to start: it never falls back to admitting any image, and it never runs warm on an
//! allow-list read before an incoming image's policy was uploaded (the deployment names the
//! incoming image as soon as its keys exist, which replaces the warm instances).

use cloud::ObjectStore;
use ed25519_dalek::VerifyingKey;
use protocol::attestation::TrustAnchor;
use protocol::attestation::{PolicySet, PolicySetError};
use protocol::receipt_check::ReceiptVerifier;

use crate::shell::{self, ShellError};

/// Where the policies are kept in the artifacts bucket unless `EPHEM_POLICIES_PREFIX` says.
pub const DEFAULT_PREFIX: &str = "artifacts/policies/";
/// More policy objects than this is a misconfiguration, not an allow-list.
const MAX_POLICIES: usize = 16;
/// A policy file is well under this (a PEM root makes it about 2 KiB).
const MAX_POLICY_BYTES: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum PoliciesError {
    #[error("the image publisher key must be 64 hex digits of an Ed25519 public key")]
    PublisherKey,
    #[error("policies under {prefix}: {source}")]
    Store { prefix: String, source: cloud::ObjectError },
    #[error("policy object {key} is {size} bytes (at most {MAX_POLICY_BYTES})")]
    TooLarge { key: String, size: u64 },
    #[error("{count} policy objects under {prefix} (at most {MAX_POLICIES})")]
    TooMany { prefix: String, count: usize },
    #[error("policy object {key} is not UTF-8")]
    NotText { key: String },
    #[error("image PCR0 {0:?} is not 96 hex digits")]
    ImageSyntax(String),
    #[error("no policy under the allow-list admits image PCR0 {0}: upload its signed policy first")]
    ImageNotAdmitted(String),
    #[error(transparent)]
    Policies(#[from] PolicySetError),
}

/// Refuses `set` unless a policy of it names each image of `pcr0s` (comma-separated hex; empty:
/// nothing named).
pub fn check_images(set: &PolicySet, pcr0s: &str) -> Result<(), PoliciesError> {
    for text in pcr0s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let pcr0 = hex::decode(text).ok().filter(|b| b.len() == 48).ok_or_else(|| PoliciesError::ImageSyntax(text.to_owned()))?;
        if !set.policies().iter().any(|p| p.policy.pcrs.get(&0) == Some(&pcr0)) {
            return Err(PoliciesError::ImageNotAdmitted(text.to_lowercase()));
        }
    }
    Ok(())
}

/// The image publisher's key, as 64 hex digits.
pub fn publisher_key(hex_key: &str) -> Result<VerifyingKey, PoliciesError> {
    let bytes: [u8; 32] =
        hex::decode(hex_key.trim()).ok().and_then(|b| b.try_into().ok()).ok_or(PoliciesError::PublisherKey)?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| PoliciesError::PublisherKey)
}

/// Every policy under `prefix` in `store`, verified with `publisher`.
pub fn load(store: &dyn ObjectStore, prefix: &str, publisher: &VerifyingKey) -> Result<PolicySet, PoliciesError> {
    let failed = |source| PoliciesError::Store { prefix: prefix.to_owned(), source };
    let listed = store.list(prefix).map_err(failed)?;
    if listed.len() > MAX_POLICIES {
        return Err(PoliciesError::TooMany { prefix: prefix.to_owned(), count: listed.len() });
    }
    let mut files = Vec::with_capacity(listed.len());
    for meta in listed {
        if meta.size > MAX_POLICY_BYTES {
            return Err(PoliciesError::TooLarge { key: meta.key, size: meta.size });
        }
        let bytes = store.get(&meta.key).map_err(failed)?;
        let text = String::from_utf8(bytes).map_err(|_| PoliciesError::NotText { key: meta.key.clone() })?;
        files.push((meta.key, text));
    }
    Ok(PolicySet::from_json(publisher, &files)?)
}

/// The verified policies the function's environment names (logged, one line each).
pub fn policies_from_env(clients: &cloud_aws::AwsClients) -> Result<PolicySet, ShellError> {
    let invalid = |name: &'static str| move |e: PoliciesError| ShellError::Invalid { name, message: e.to_string() };
    let publisher = publisher_key(&shell::var("EPHEM_IMAGE_PUBLISHER_KEY")?).map_err(invalid("EPHEM_IMAGE_PUBLISHER_KEY"))?;
    let bucket = shell::var("EPHEM_POLICIES_BUCKET")?;
    let prefix = shell::optional("EPHEM_POLICIES_PREFIX").unwrap_or_else(|| DEFAULT_PREFIX.to_owned());
    let set = load(&clients.object_store(&bucket, ""), &prefix, &publisher).map_err(invalid("EPHEM_POLICIES_BUCKET"))?;
    check_images(&set, &shell::optional("EPHEM_IMAGE_PCR0S").unwrap_or_default()).map_err(invalid("EPHEM_IMAGE_PCR0S"))?;
    for p in set.policies() {
        let pcr0 = p.policy.pcrs.get(&0).map(hex::encode).unwrap_or_default();
        tracing::info!(policy = %hex::encode(p.id), source = %p.source, %pcr0, "receipts admitted under this policy");
    }
    Ok(set)
}

/// The receipt check a function enforces: documents under `root` satisfying the policies its
/// environment names.
pub fn receipt_check_from_env(clients: &cloud_aws::AwsClients, root: TrustAnchor) -> Result<ReceiptVerifier, ShellError> {
    ReceiptVerifier::enforcing(root, policies_from_env(clients)?)
        .map_err(|e| ShellError::Invalid { name: "EPHEM_POLICIES_BUCKET", message: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloud_local::DirObjectStore;
    use cloud::PutCondition;
    use ed25519_dalek::SigningKey;
    use protocol::dev_enclave::DevEnclave;

    const T: u64 = 1_761_955_200_000;

    #[test]
    fn every_policy_under_the_prefix_is_verified_and_a_bad_one_stops_the_load() {
        let tmp = tempfile::tempdir().unwrap();
        let store = DirObjectStore::open(tmp.path()).unwrap();
        let publisher = SigningKey::from_bytes(&[0x51; 32]);
        let key = publisher_key(&hex::encode(publisher.verifying_key().to_bytes())).unwrap();
        let put = |k: &str, v: &[u8]| store.put(k, v, PutCondition::Overwrite).unwrap();
        assert!(matches!(load(&store, DEFAULT_PREFIX, &key), Err(PoliciesError::Policies(PolicySetError::Empty))));
        let (old, new) = (DevEnclave::new(1, T), DevEnclave::with_image(1, 0x0b, T));
        put("artifacts/policies/old.json", old.policy(&publisher).to_json().as_bytes());
        put("artifacts/policies/new.json", new.policy(&publisher).to_json().as_bytes());
        put("artifacts/enclave.eif", b"not a policy, not under the prefix");
        let set = load(&store, DEFAULT_PREFIX, &key).unwrap();
        assert_eq!(set.policies().len(), 2);
        put("artifacts/policies/rogue.json", DevEnclave::with_image(1, 0x0c, T).policy(&SigningKey::from_bytes(&[9; 32])).to_json().as_bytes());
        let err = load(&store, DEFAULT_PREFIX, &key).unwrap_err();
        assert!(err.to_string().starts_with("policy artifacts/policies/rogue.json: policy is signed by publisher key"), "{err}");
        assert!(matches!(publisher_key("abcd"), Err(PoliciesError::PublisherKey)));
    }

    /// An update names the incoming image before the functions restart: an allow-list read
    /// before its policy was uploaded refuses to start instead of refusing its receipts.
    #[test]
    fn every_named_image_must_have_a_policy() {
        let publisher = SigningKey::from_bytes(&[0x51; 32]);
        let (old, new) = (DevEnclave::new(1, T), DevEnclave::with_image(1, 0x0b, T));
        let only_old = PolicySet::verify(&publisher.verifying_key(), vec![("old".into(), old.policy(&publisher))]).unwrap();
        let (old_pcr0, new_pcr0) = (hex::encode(old.pcrs[0]), hex::encode(new.pcrs[0]));
        check_images(&only_old, &old_pcr0).unwrap();
        check_images(&only_old, "").unwrap();
        let err = check_images(&only_old, &format!("{old_pcr0},{new_pcr0}")).unwrap_err();
        assert!(matches!(&err, PoliciesError::ImageNotAdmitted(p) if *p == new_pcr0), "{err}");
        let both = PolicySet::verify(
            &publisher.verifying_key(),
            vec![("old".into(), old.policy(&publisher)), ("new".into(), new.policy(&publisher))],
        )
        .unwrap();
        check_images(&both, &format!("{old_pcr0}, {}", new_pcr0.to_uppercase())).unwrap();
        assert!(matches!(check_images(&both, "abcd"), Err(PoliciesError::ImageSyntax(_))));
    }
}
