use super::*;
use crate::checkpoint::Checkpoint;
use crate::note::SignerKey;

pub(crate) const KAT_WITNESS: &str = "witness.ephem-batch.example/w1";
pub(crate) const KAT_WITNESS_SEED: [u8; 32] = [0x57; 32];
const KAT_TIME: u64 = 1_700_000_000;

fn kat_checkpoint() -> (SignerKey, String) {
    let key = SignerKey::from_seed("ledger.ephem-batch.example/test", &[0x42; 32]).unwrap();
    let cp = Checkpoint::new(key.verifier().name(), 1, crate::merkle::leaf_hash(b""));
    let signed = cp.sign(&key).unwrap();
    (key, signed)
}

/// Known answer, in docs/protocol.md §8.12 and verified by Go's transparency-dev/formats
/// in tests/go-interop.
#[test]
fn known_answer_cosignature() {
    let w = CosignerSigner::from_seed(KAT_WITNESS, &KAT_WITNESS_SEED).unwrap();
    let (_, signed) = kat_checkpoint();
    let text = Note::parse(signed.as_bytes()).unwrap().text;
    assert_eq!(
        String::from_utf8(signed_message(&text, KAT_TIME)).unwrap(),
        "cosignature/v1\ntime 1700000000\nledger.ephem-batch.example/test\n1\nbjQLnP+zepicpUTmu3gKLHiQHT+zNzh2hRGjBhevoB0=\n"
    );
    assert_eq!(w.verifier().to_string(), KAT_VKEY);
    assert_eq!(w.cosign(&text, KAT_TIME), KAT_LINE);
    assert_eq!(CosignerKey::parse(KAT_VKEY).unwrap(), w.verifier());
    assert_eq!(CosignerSigner::parse(&w.to_secret_string()).unwrap().verifier(), w.verifier());
}

const KAT_VKEY: &str = "witness.ephem-batch.example/w1+b80ae4a4+BMhAafoiFsbtwdUsqDqhHCZ91UQK+lJgkMpD69DKhqnP";
const KAT_LINE: &str = "\u{2014} witness.ephem-batch.example/w1 uArkpAAAAABlU/EA6lAitav1iz5+gVauYt7YlQaVGh48bC6pFiS0IcItrMoAaSp6AYOKcoAOsNtL7oHS+B9dzmfOzeCrk7t8ae2XDQ==\n";

#[test]
fn cosigned_note_verifies_and_the_log_signature_still_does() {
    let (log, signed) = kat_checkpoint();
    let w1 = CosignerSigner::from_seed("w1.example", &[1; 32]).unwrap();
    let w2 = CosignerSigner::from_seed("w2.example", &[2; 32]).unwrap();
    let text = Note::parse(signed.as_bytes()).unwrap().text;
    let both = add_signature_lines(&signed, &(w1.cosign(&text, 10) + &w2.cosign(&text, 11))).unwrap();
    // Adding the same lines again changes nothing.
    assert_eq!(add_signature_lines(&both, &w1.cosign(&text, 10)).unwrap(), both);
    assert_eq!(Checkpoint::open(both.as_bytes(), &log.verifier()).unwrap().size, 1);
    let policy = WitnessPolicy::new(vec![w1.verifier(), w2.verifier()], 2).unwrap();
    let got = policy.check(both.as_bytes()).unwrap();
    assert_eq!(got.iter().map(|(k, t)| (k.name(), *t)).collect::<Vec<_>>(), vec![("w1.example", 10), ("w2.example", 11)]);
    // One cosignature short of the quorum: refused by name.
    let one = add_signature_lines(&signed, &w1.cosign(&text, 10)).unwrap();
    assert!(matches!(policy.check(one.as_bytes()), Err(WitnessPolicyError::QuorumNotMet { have: 1, need: 2, .. })));
    // A cosignature over another checkpoint (same key) does not count: it fails by name.
    let other = Checkpoint::new(log.verifier().name(), 2, [7; 32]).to_text();
    let moved = add_signature_lines(&signed, &w2.cosign(&other, 11)).unwrap();
    assert!(matches!(
        policy.check(moved.as_bytes()),
        Err(WitnessPolicyError::Cosignature(CosignatureError::BadCosignature { .. }))
    ));
    // A log-type (0x01) key with the witness's name is another key: its id differs.
    assert_ne!(crate::note::key_id("w1.example", &w1.key.verifying_key()), w1.verifier().id());
    assert!(matches!(WitnessPolicy::new(vec![w1.verifier()], 2), Err(WitnessPolicyError::QuorumTooLarge { .. })));
    assert!(matches!(
        WitnessPolicy::new(vec![w1.verifier(), w1.verifier()], 2),
        Err(WitnessPolicyError::QuorumTooLarge { need: 2, keys: 1 })
    ));
}

#[test]
fn timestamps_and_lengths_are_checked() {
    let w = CosignerSigner::from_seed("w.example", &[3; 32]).unwrap();
    let text = "o\n1\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n";
    let zero = w.cosign(text, 0);
    let raw = STANDARD.decode(zero.trim_end().rsplit_once(' ').unwrap().1).unwrap();
    assert!(matches!(w.verifier().verify(text, &raw[4..]), Err(CosignatureError::Timestamp { timestamp: 0, .. })));
    let big = w.cosign(text, MAX_TIMESTAMP + 1);
    let raw = STANDARD.decode(big.trim_end().rsplit_once(' ').unwrap().1).unwrap();
    assert!(matches!(w.verifier().verify(text, &raw[4..]), Err(CosignatureError::Timestamp { .. })));
    assert!(matches!(w.verifier().verify(text, &raw[4..70]), Err(CosignatureError::Length { len: 66, .. })));
    let ok = w.cosign(text, 5);
    let raw = STANDARD.decode(ok.trim_end().rsplit_once(' ').unwrap().1).unwrap();
    assert_eq!(w.verifier().verify(text, &raw[4..]), Ok(5));
    let mut flipped = raw[4..].to_vec();
    flipped[7] ^= 1; // the timestamp is signed
    assert!(matches!(w.verifier().verify(text, &flipped), Err(CosignatureError::BadCosignature { .. })));
}

#[test]
fn key_strings_are_strict() {
    let w = CosignerSigner::from_seed("w.example", &[4; 32]).unwrap();
    let good = w.verifier().to_string();
    assert_eq!(CosignerKey::parse(&good).unwrap(), w.verifier());
    // A note (0x01) key string is not a cosigner key.
    let log = SignerKey::from_seed("w.example", &[4; 32]).unwrap().verifier().to_string();
    assert_eq!(CosignerKey::parse(&log), Err(CosignatureError::KeyShape));
    let (head, _) = good.rsplit_once('+').unwrap();
    let wrong_id = format!("w.example+00000000+{}", good.rsplit_once('+').unwrap().1);
    assert!(matches!(CosignerKey::parse(&wrong_id), Err(CosignatureError::KeyIdMismatch { .. })));
    assert_eq!(CosignerKey::parse(&format!("{head}+AAAA")), Err(CosignatureError::KeyShape));
    assert!(CosignerKey::parse("w example+00000000+AAAA").is_err());
    assert!(!format!("{w:?}").contains(&w.to_secret_string()[30..]));
}
