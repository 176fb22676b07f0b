//! Known-answer vectors, each produced from a fixed seed. `docs/protocol.md` quotes these
//! constants; unit tests next to each format regenerate them and compare.

use std::collections::BTreeMap;

use super::binding::UserDataBinding;
use super::dev_issuer::DocumentRequest;
use super::policy::Policy;

// ---- user_data binding -------------------------------------------------------------------

/// Fleet key: P-256 public key of the secret scalar SHA-256("ephem-batch kat fleet key").
/// Receipt key: Ed25519 public key of the seed SHA-256("ephem-batch kat receipt key"). Epoch 7,
/// not_after 2026-01-01T00:00:00Z, KMS key [`BINDING_KMS_KEY`].
pub fn binding_sample() -> UserDataBinding {
    use p256::elliptic_curve::sec1::ToSec1Point;
    use sha2::{Digest, Sha256};
    let fleet_secret: [u8; 32] = Sha256::digest(b"ephem-batch kat fleet key").into();
    let fleet = p256::SecretKey::from_slice(&fleet_secret).map(|k| k.public_key());
    let mut fleet_point = [0u8; 65];
    if let Ok(pk) = fleet {
        fleet_point.copy_from_slice(pk.to_sec1_point(false).as_bytes());
    }
    let receipt_seed: [u8; 32] = Sha256::digest(b"ephem-batch kat receipt key").into();
    let receipt = ed25519_dalek::SigningKey::from_bytes(&receipt_seed).verifying_key().to_bytes();
    let kms_key = BINDING_KMS_KEY.parse().unwrap_or_else(|_| unreachable!("a valid key ARN"));
    UserDataBinding { fleet_public_key: fleet_point, receipt_public_key: receipt, epoch: 7, not_after_ms: 1_767_225_600_000, kms_key }
}

/// The KMS key ARN of the binding vector (AWS's documentation example key).
pub const BINDING_KMS_KEY: &str = "arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab";

pub const BINDING_HEX: &str = "a6000201584104dee96271b6cacf3d980d3b0509b1f9172c274358afc338e2a08c0ebb63b8978a8b5fcb054a384df6e4464841b6f7b539879794cded18b5e7b4b882883040495a0258206f97fd54784a0dc3fa08bc1162a674d51e2e9108a44afd5f945da8db17f190dc0307041b0000019b76daa80005784b61726e3a6177733a6b6d733a75732d656173742d313a3131313132323232333333333a6b65792f31323334616263642d313261622d333463642d353665662d313233343536373839306162";
pub const BINDING_FLEET_KEY_ID_HEX: &str = "6c81632c30e8499daf5298ada4f65487ea785118e36d221f453b157e2a1a0fb3";
pub const BINDING_RECEIPT_KEY_ID_HEX: &str = "b06186a3f33df1d91bdd53fe1c28a07848e3d66e4770c27b955bca5117143759";

// ---- policy file -------------------------------------------------------------------------

/// PCR0/1/2 of the real us-east-2 document of 2023-06-06, AWS root, debug refused, max age 600 s;
/// publisher key: Ed25519 seed SHA-256("ephem-batch kat policy publisher").
pub fn policy_sample() -> (Policy, ed25519_dalek::SigningKey) {
    use sha2::{Digest, Sha256};
    let pcr = |h: &str| hex::decode(h).unwrap_or_default();
    let pcrs: BTreeMap<u8, Vec<u8>> = [
        (0, pcr("836fa88a3e7ba543c2d8587cbf1ecbc285434fd2253fab68c20fcdd46ac749f1d33e10fa15601f77ce4ef1793ebd3901")),
        (1, pcr("bcdf05fefccaa8e55bf2c8d6dee9e79bbff31e34bf28a99aa19e6b29c37ee80b214a414b7607236edf26fcb78654e63f")),
        (2, pcr("4314515615d0365648a8763292907c99353a10477d51934333c69b27612ea6db73522675324fe069f6e8cd3eb910d0d6")),
    ]
    .into();
    let mut policy = Policy::aws(pcrs);
    policy.max_age_s = 600;
    let seed: [u8; 32] = Sha256::digest(b"ephem-batch kat policy publisher").into();
    (policy, ed25519_dalek::SigningKey::from_bytes(&seed))
}

pub const POLICY_SIGNED_BYTES_HEX: &str = "87781e657068656d2d6261746368206174746573746174696f6e20706f6c696379015820641a0321a3e244efe456463195d606317ed7cdcc3c1756e09893f3c68f79bb5ba3005830836fa88a3e7ba543c2d8587cbf1ecbc285434fd2253fab68c20fcdd46ac749f1d33e10fa15601f77ce4ef1793ebd3901015830bcdf05fefccaa8e55bf2c8d6dee9e79bbff31e34bf28a99aa19e6b29c37ee80b214a414b7607236edf26fcb78654e63f0258304314515615d0365648a8763292907c99353a10477d51934333c69b27612ea6db73522675324fe069f6e8cd3eb910d0d6f4190258582078527151d5b61e64775a38309546304a477a09801fae9dae02aa9baf2972b191";
pub const POLICY_SIGNATURE_HEX: &str = "fe7e28822acd490bec2c9c5c667ed8d4fa77db8900b7dda0bc070e898114b2edb128eb19cb3f8b4dd2b561a133d1026a71a5079f8aaac55e00fd66a278de0507";
pub const POLICY_JSON: &str = r#"{
  "version": 1,
  "root": "aws-nitro-g1",
  "pcrs": {
    "0": "836fa88a3e7ba543c2d8587cbf1ecbc285434fd2253fab68c20fcdd46ac749f1d33e10fa15601f77ce4ef1793ebd3901",
    "1": "bcdf05fefccaa8e55bf2c8d6dee9e79bbff31e34bf28a99aa19e6b29c37ee80b214a414b7607236edf26fcb78654e63f",
    "2": "4314515615d0365648a8763292907c99353a10477d51934333c69b27612ea6db73522675324fe069f6e8cd3eb910d0d6"
  },
  "allow_debug": false,
  "max_age_s": 600,
  "publisher_key_id": "78527151d5b61e64775a38309546304a477a09801fae9dae02aa9baf2972b191",
  "signature": "fe7e28822acd490bec2c9c5c667ed8d4fa77db8900b7dda0bc070e898114b2edb128eb19cb3f8b4dd2b561a133d1026a71a5079f8aaac55e00fd66a278de0507"
}
"#;

// ---- development issuer ------------------------------------------------------------------

/// Seed of the development issuer vectors: bytes 0x00, 0x01, …, 0x1f.
pub const DEV_SEED: [u8; 32] = [
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
];
/// CA creation time: 2025-01-01T00:00:00Z.
pub const DEV_CA_TIME_MS: u64 = 1_735_689_600_000;
/// Document time: 2025-01-01T00:10:00.123Z.
pub const DEV_DOC_TIME_MS: u64 = 1_735_690_200_123;

/// module_id "i-00000000000000000-enc0000000000000000", PCR0 = 0x01 × 48, PCR1 = 0x02 × 48,
/// PCR2 = 0x03 × 48, other PCRs zero, nonce = 0x00 0x01 … 0x0f, public_key and user_data absent.
pub fn dev_request() -> DocumentRequest {
    let mut req = DocumentRequest::new("i-00000000000000000-enc0000000000000000")
        .with_pcr(0, [1; 48])
        .with_pcr(1, [2; 48])
        .with_pcr(2, [3; 48]);
    req.nonce = Some((0u8..16).collect());
    req
}

pub const DEV_ROOT_DER_HEX: &str = "3082023c308201c1a00302010202105da1b82a31c119760e8e2b8a2bb8e9f1300a06082a8648ce3d040303305f31143012060355040a0c0b657068656d2d62617463683120301e060355040b0c17657068656d2d626174636820646576656c6f706d656e743125302306035504030c1c657068656d2d626174636820646576656c6f706d656e7420726f6f74301e170d3235303130313030303030305a170d3334313233303030303030305a305f31143012060355040a0c0b657068656d2d62617463683120301e060355040b0c17657068656d2d626174636820646576656c6f706d656e743125302306035504030c1c657068656d2d626174636820646576656c6f706d656e7420726f6f743076301006072a8648ce3d020106052b810400220362000487a59be7defe26e139a3ed7db5ea518b9c8aa8cc0d789d93d3b554088e44bc59e925068b078789d5f82655a9e15d9da2a4137ec0b798b132f04541fabfd73e6fb7186c7e8b8be3460d01eedd067dedd42297e9719c8ac31e83ac596a7e211bf1a3423040300f0603551d130101ff040530030101ff300e0603551d0f0101ff040403020106301d0603551d0e0416041473d242aac009ec39a657cde453f5a2193bf9a445300a06082a8648ce3d04030303690030660231009b81471f4c8ff5ab0b63a262c286669228c83666fae16e93dd8199890b4ddc4b485dc1f4062f6ba059d8ae9d8d95e46b023100e3fdb2d88aad9e62036c955aac55bae617bda94425f6d3798addc725e291ebf841432a40fe6c71b5ef30dc8b2cb59a7c";
pub const DEV_ROOT_SHA256_HEX: &str = "6456e6601e0b88860b2e6af62b7b17c27152d2d1f1207c812fdfe1f9d8c20681";
pub const DEV_INTERMEDIATE_SHA256_HEX: &str = "8b5eabb5c7c4b73b53b3075316aa741762a85b101b511d3e90224cd775d66948";
pub const DEV_LEAF_SHA256_HEX: &str = "abbaa2bd3028eedacfe079493d6da0d602e7750352420602333eac3383d94690";
pub const DEV_DOC_SHA256_HEX: &str = "6095060251b68482938b9dbd2d0cfc51dd123bf2e7d0f96b6483a69e48fe3a63";

