//! Cancelling a job that has not started: `jobs/<id>/cancel.json` carries a signature over the
//! job id by the job's result key, and a host honours it only if the signature verifies against
//! the result key the job's own header names (docs/protocol.md §2.4).
//!
//! Anyone who can write the bucket can write a cancel; only the submitter holds the result key.
//! The result key is an X25519 key (HPKE), so it signs as XEdDSA does (Signal's specification,
//! 2016): the Montgomery key maps to the Edwards point of sign 0, and the signature verifies as
//! Ed25519 against that point. The header already commits to the result key and the job id
//! derives from the header, so no header field is added and every job, older ones included,
//! can be cancelled by its submitter and by nobody else.

use curve25519_dalek::edwards::EdwardsPoint;
use curve25519_dalek::montgomery::MontgomeryPoint;
use curve25519_dalek::scalar::{clamp_integer, Scalar};
use ed25519_dalek::{Signature, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha512};
use zeroize::Zeroizing;

use crate::envelope::{EnvelopeError, JobHeader, JobId, Preamble, ResultSecretKey, StreamKind, MAX_JOB_PREAMBLE_LEN};

/// Domain of the signed message: `label ‖ 0x00 ‖ job id (16 bytes)`.
pub const CANCEL_LABEL: &[u8] = b"ephem-batch/v1 cancel";
/// The most of a cancel object a host reads; a genuine one is about 250 bytes.
pub const MAX_CANCEL_LEN: u64 = 1024;
/// How much of the sealed input a host reads to find the result key: the longest preamble.
pub const INPUT_PREFIX_LEN: u64 = MAX_JOB_PREAMBLE_LEN as u64;
pub const SIGNATURE_LEN: usize = 64;

/// Why a cancel was not honoured; each check by name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CancelError {
    #[error("cancel object malformed: {0}")]
    Malformed(String),
    #[error("cancel object names job {named}, not this job")]
    OtherJob { named: JobId },
    #[error("the job's sealed input: {0}")]
    Input(EnvelopeError),
    #[error("the sealed input derives job id {derived}, not this job's")]
    InputNotThisJob { derived: JobId },
    #[error("the job's result key is not a canonical point of Curve25519")]
    ResultKey,
    #[error("the signature does not verify against the job's result key")]
    Signature,
}

/// `cancel.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    pub v: u32,
    /// The job it cancels (32 lowercase hex digits in JSON).
    pub job_id: JobId,
    /// Client clock, Unix milliseconds (informative, not signed).
    pub requested_ms: u64,
    /// 128 hex digits: XEdDSA over `CANCEL_LABEL ‖ 0x00 ‖ job id` by the job's result key.
    pub signature: String,
}

impl CancelRequest {
    /// A cancel of `job` signed with `key`.
    pub fn new(key: &ResultSecretKey, job: &JobId, requested_ms: u64) -> CancelRequest {
        CancelRequest { v: 1, job_id: *job, requested_ms, signature: hex::encode(sign(key, job)) }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a cancel request serialises")
    }

    pub fn from_json(bytes: &[u8]) -> Result<CancelRequest, CancelError> {
        if bytes.len() as u64 > MAX_CANCEL_LEN {
            return Err(CancelError::Malformed(format!("larger than {MAX_CANCEL_LEN} bytes")));
        }
        let request: CancelRequest = serde_json::from_slice(bytes).map_err(|e| CancelError::Malformed(e.to_string()))?;
        if request.v != 1 {
            return Err(CancelError::Malformed(format!("unknown version {}", request.v)));
        }
        Ok(request)
    }

    /// The signature's bytes, from exactly one spelling of them: lowercase hex, as the job id.
    /// (Uppercase digits would decode to the same bytes, so two different `cancel.json` would
    /// carry one signature.)
    fn signature_bytes(&self) -> Result<[u8; SIGNATURE_LEN], CancelError> {
        let malformed = || CancelError::Malformed("signature is not 64 bytes in lowercase hex".into());
        if self.signature.chars().any(|c| c.is_ascii_uppercase()) {
            return Err(malformed());
        }
        let mut signature = [0u8; SIGNATURE_LEN];
        hex::decode_to_slice(&self.signature, &mut signature).map_err(|_| malformed())?;
        Ok(signature)
    }
}

/// What the host checks before honouring a cancel: `body` (cancel.json) names `job` and its
/// signature verifies against the result key in the header of `input_prefix` (the first
/// [`INPUT_PREFIX_LEN`] bytes of the job's sealed input, or all of it), whose derived job id
/// must be `job`: the header, and so the key, is the one the job id commits to.
pub fn check(input_prefix: &[u8], job: &JobId, body: &[u8]) -> Result<(), CancelError> {
    let request = CancelRequest::from_json(body)?;
    if request.job_id != *job {
        return Err(CancelError::OtherJob { named: request.job_id });
    }
    let signature = request.signature_bytes()?;
    let (preamble, _) = Preamble::parse_complete(input_prefix, StreamKind::JobInput).map_err(CancelError::Input)?;
    let derived = JobId(preamble.stream_id());
    if derived != *job {
        return Err(CancelError::InputNotThisJob { derived });
    }
    let header = JobHeader::from_bytes(&preamble.header).map_err(CancelError::Input)?;
    verify(&header.result_public_key, job, &signature)
}

/// The signed message.
pub fn message(job: &JobId) -> Vec<u8> {
    let mut message = Vec::with_capacity(CANCEL_LABEL.len() + 1 + job.0.len());
    message.extend_from_slice(CANCEL_LABEL);
    message.push(0);
    message.extend_from_slice(&job.0);
    message
}

/// Signs a cancel of `job` (XEdDSA, 64 fresh random bytes in the nonce).
pub fn sign(key: &ResultSecretKey, job: &JobId) -> [u8; SIGNATURE_LEN] {
    let mut z = Zeroizing::new([0u8; 64]);
    getrandom::fill(z.as_mut()).expect("the operating system's random source");
    sign_with_z(key, job, &z)
}

/// [`sign`] with the nonce input `z` given: only for known-answer vectors.
#[doc(hidden)]
pub fn sign_with_z(key: &ResultSecretKey, job: &JobId, z: &[u8; 64]) -> [u8; SIGNATURE_LEN] {
    let (a, public) = edwards_key_pair(key);
    let message = message(job);
    // r = hash1(a ‖ M ‖ Z): hash_1(X) = SHA-512((2^256 - 2) little-endian ‖ X).
    let mut prefix = [0xffu8; 32];
    prefix[0] = 0xfe;
    let r = Zeroizing::new(Scalar::from_bytes_mod_order_wide(
        &Sha512::new().chain_update(prefix).chain_update(a.as_bytes()).chain_update(&message).chain_update(z).finalize().into(),
    ));
    let big_r = EdwardsPoint::mul_base(&r).compress();
    let h = Scalar::from_bytes_mod_order_wide(&Sha512::new().chain_update(big_r.as_bytes()).chain_update(public).chain_update(&message).finalize().into());
    let s = *r + h * *a;
    let mut signature = [0u8; SIGNATURE_LEN];
    signature[..32].copy_from_slice(big_r.as_bytes());
    signature[32..].copy_from_slice(s.as_bytes());
    signature
}

/// Verifies a cancel signature of `job` against an X25519 result public key.
pub fn verify(result_public_key: &[u8; 32], job: &JobId, signature: &[u8; SIGNATURE_LEN]) -> Result<(), CancelError> {
    let public = edwards_public(result_public_key)?;
    let key = VerifyingKey::from_bytes(&public).map_err(|_| CancelError::ResultKey)?;
    // Strict: canonical s, and neither R nor the key of small order.
    key.verify_strict(&message(job), &Signature::from_bytes(signature)).map_err(|_| CancelError::Signature)
}

/// The Edwards form (sign 0) of a Montgomery u-coordinate; refused unless `u` is the canonical
/// encoding of a point on the curve (not its twist, not u ≥ p).
pub fn edwards_public(u: &[u8; 32]) -> Result<[u8; 32], CancelError> {
    let point = MontgomeryPoint(*u).to_edwards(0).ok_or(CancelError::ResultKey)?;
    if point.to_montgomery().to_bytes() != *u {
        return Err(CancelError::ResultKey);
    }
    Ok(point.compress().to_bytes())
}

/// XEdDSA's `calculate_key_pair`: the clamped X25519 scalar, negated when its Edwards point has
/// sign 1, so the public key is the sign-0 point the Montgomery key maps to.
fn edwards_key_pair(key: &ResultSecretKey) -> (Zeroizing<Scalar>, [u8; 32]) {
    let bytes = key.to_bytes();
    let mut clamped = Zeroizing::new([0u8; 32]);
    clamped.copy_from_slice(&bytes);
    let k = Zeroizing::new(Scalar::from_bytes_mod_order(clamp_integer(*clamped)));
    let mut public = EdwardsPoint::mul_base(&k).compress().to_bytes();
    let a = if public[31] & 0x80 != 0 { Zeroizing::new(-*k) } else { k };
    public[31] &= 0x7f;
    (a, public)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{seal_job, FleetSecretKey, JobOptions};

    fn job(seed: u8) -> JobId {
        JobId([seed; 16])
    }

    #[test]
    fn the_edwards_key_is_the_montgomery_keys_sign_zero_point() {
        // Half of all keys have an Edwards point of sign 1: both branches, many times.
        for _ in 0..64 {
            let key = ResultSecretKey::generate();
            let (_, public) = edwards_key_pair(&key);
            assert_eq!(edwards_public(&key.public_key().to_bytes()).unwrap(), public);
        }
    }

    #[test]
    fn only_the_result_keys_signature_over_this_job_verifies() {
        let key = ResultSecretKey::generate();
        let public = key.public_key().to_bytes();
        let signature = sign(&key, &job(1));
        verify(&public, &job(1), &signature).unwrap();
        assert_ne!(sign(&key, &job(1)), signature, "a fresh nonce each time");
        verify(&public, &job(1), &sign(&key, &job(1))).unwrap();

        let other = ResultSecretKey::generate();
        assert_eq!(verify(&public, &job(1), &sign(&other, &job(1))), Err(CancelError::Signature), "another tenant's key");
        assert_eq!(verify(&public, &job(2), &signature), Err(CancelError::Signature), "replayed for another job");
        for bit in [0, 7, 255, 256, 300, 511] {
            let mut flipped = signature;
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(verify(&public, &job(1), &flipped).is_err(), "bit {bit} flipped");
        }
        // A key that is no curve point (u = p - 1 + 1 = p is non-canonical; u = -1 is on the twist).
        let mut p = [0xffu8; 32];
        p[0] = 0xed;
        p[31] = 0x7f;
        assert_eq!(verify(&p, &job(1), &signature), Err(CancelError::ResultKey));
        let mut minus_one = p;
        minus_one[0] = 0xec;
        assert_eq!(verify(&minus_one, &job(1), &signature), Err(CancelError::ResultKey));
    }

    #[test]
    fn a_host_checks_the_cancel_against_the_key_the_job_id_commits_to() {
        let fleet = FleetSecretKey::generate().public_key();
        let submitter = ResultSecretKey::generate();
        let header = JobHeader {
            fleet_key_id: fleet.key_id(),
            epoch: 1,
            model_id: "m".into(),
            manifest_hash: [1; 32],
            options: JobOptions::default(),
            result_public_key: submitter.public_key().to_bytes(),
            record_count: 1,
            created_ms: 1,
        };
        let sealed = seal_job(&header, &fleet).unwrap();
        let id = JobId(sealed.stream_id);
        let input = sealed.preamble;

        let genuine = CancelRequest::new(&submitter, &id, 5).to_json();
        check(&input, &id, genuine.as_bytes()).unwrap();

        let tenant = ResultSecretKey::generate();
        let forged = CancelRequest::new(&tenant, &id, 5).to_json();
        assert_eq!(check(&input, &id, forged.as_bytes()), Err(CancelError::Signature));
        assert_eq!(check(&input, &id, b"{}").map_err(|e| matches!(e, CancelError::Malformed(_))), Err(true));
        let not_an_id = genuine.replace(&id.to_hex(), &format!("{}g", &id.to_hex()[..31]));
        assert!(matches!(check(&input, &id, not_an_id.as_bytes()), Err(CancelError::Malformed(m)) if m.contains("is not a job id")));
        assert_eq!(check(&input, &job(9), genuine.as_bytes()), Err(CancelError::OtherJob { named: id }));
        // The submitter's cancel of its own job, presented beside another job's input.
        let other = seal_job(&JobHeader { record_count: 2, ..header.clone() }, &fleet).unwrap();
        assert!(matches!(check(&other.preamble, &id, genuine.as_bytes()), Err(CancelError::InputNotThisJob { .. })));
        assert!(matches!(check(&input[..input.len() - 1], &id, genuine.as_bytes()), Err(CancelError::Input(_))));
        // The same signature spelt with uppercase digits is another body: refused.
        let request = CancelRequest::from_json(genuine.as_bytes()).unwrap();
        let shouted = CancelRequest { signature: request.signature.to_uppercase(), ..request }.to_json();
        assert!(matches!(check(&input, &id, shouted.as_bytes()), Err(CancelError::Malformed(m)) if m.contains("lowercase hex")));
        let padded = format!("{genuine}{}", " ".repeat(MAX_CANCEL_LEN as usize));
        assert!(matches!(check(&input, &id, padded.as_bytes()), Err(CancelError::Malformed(_))));
    }
}
