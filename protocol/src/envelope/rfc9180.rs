//! RFC 9180 Appendix A known answers for the two suites the envelopes use, read from
//! `$EPHEM_FIXTURES/hpke/` (base mode: the only mode ephem-batch uses).

use hpke::aead::ChaCha20Poly1305;
use hpke::kdf::HkdfSha256;
use hpke::{Deserializable, Kem, OpModeR, OpModeS, Serializable};

use super::{FixedIkm, FleetKem, ResultKem};

fn fixtures() -> std::path::PathBuf {
    std::env::var_os("EPHEM_FIXTURES")
        .map(Into::into)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures").into())
}

/// One `key: value` field; hex values may wrap onto following lines.
type Fields = Vec<(String, String)>;

fn base_mode_section(file: &str) -> (Fields, Vec<Fields>, Vec<Fields>) {
    let text = std::fs::read_to_string(fixtures().join("hpke").join(file))
        .unwrap_or_else(|e| panic!("reading HPKE vectors {file}: {e} (set EPHEM_FIXTURES)"));
    let section = text.split("\n### ").find(|s| s.starts_with("Base Setup Information")).expect("base section");
    let mut setup = Fields::new();
    let mut encryptions = Vec::new();
    let mut exports = Vec::new();
    let mut part = 0;
    let mut pending: Fields = Vec::new();
    for line in section.lines().skip(1) {
        let line = line.trim();
        if line.starts_with("#### Encryptions") {
            part = 1;
            continue;
        }
        if line.starts_with("#### Exported") {
            part = 2;
            continue;
        }
        if line.is_empty() || line == "~~~" {
            if part > 0 && !pending.is_empty() {
                let group = std::mem::take(&mut pending);
                if part == 1 { encryptions.push(group) } else { exports.push(group) }
            }
            continue;
        }
        let target: &mut Fields = if part == 0 { &mut setup } else { &mut pending };
        match line.split_once(':') {
            Some((key, value)) => {
                target.push((key.trim().to_owned(), value.trim().to_owned()))
            }
            _ => target.last_mut().expect("continuation").1.push_str(line),
        }
    }
    (setup, encryptions, exports)
}

fn field<'a>(fields: &'a Fields, key: &str) -> &'a str {
    &fields.iter().find(|(k, _)| k == key).unwrap_or_else(|| panic!("field {key}")).1
}

fn hex_field(fields: &Fields, key: &str) -> Vec<u8> {
    hex::decode(field(fields, key)).unwrap_or_else(|e| panic!("{key}: {e} in {fields:?}"))
}

fn check_suite<K: Kem>(file: &str, kem_id: &str) {
    let (setup, encryptions, exports) = base_mode_section(file);
    assert_eq!(field(&setup, "mode"), "0");
    assert_eq!(field(&setup, "kem_id"), kem_id);
    assert_eq!(field(&setup, "kdf_id"), "1");
    assert_eq!(field(&setup, "aead_id"), "3");
    let info = hex_field(&setup, "info");

    let (sk_r, pk_r) = K::derive_keypair(&hex_field(&setup, "ikmR"));
    assert_eq!(pk_r.to_bytes().to_vec(), hex_field(&setup, "pkRm"), "pkRm");

    let ikm_e = hex_field(&setup, "ikmE");
    let (enc, mut sender) = hpke::setup_sender_with_rng::<ChaCha20Poly1305, HkdfSha256, K>(
        &OpModeS::Base,
        &pk_r,
        &info,
        &mut FixedIkm(&ikm_e),
    )
    .unwrap();
    assert_eq!(enc.to_bytes().to_vec(), hex_field(&setup, "enc"), "enc");
    let enc = K::EncappedKey::from_bytes(&hex_field(&setup, "enc")).unwrap();
    let mut receiver =
        hpke::setup_receiver::<ChaCha20Poly1305, HkdfSha256, K>(&OpModeR::Base, &sk_r, &enc, &info).unwrap();

    assert!(encryptions.len() >= 6, "{encryptions:?}");
    let mut sequence = 0u64;
    for encryption in &encryptions {
        let target: u64 = field(encryption, "sequence number").parse().unwrap();
        // Advance both contexts over the sequence numbers the vectors skip.
        while sequence < target {
            let ct = sender.seal(b"", b"").unwrap();
            receiver.open(&ct, b"").unwrap();
            sequence += 1;
        }
        let (pt, aad, ct) = (hex_field(encryption, "pt"), hex_field(encryption, "aad"), hex_field(encryption, "ct"));
        assert_eq!(sender.seal(&pt, &aad).unwrap(), ct, "seal, sequence {target}");
        assert_eq!(receiver.open(&ct, &aad).unwrap(), pt, "open, sequence {target}");
        sequence += 1;
    }

    assert_eq!(exports.len(), 3);
    for export in &exports {
        let context = hex_field(export, "exporter_context");
        let length: usize = field(export, "L").parse().unwrap();
        let mut from_sender = vec![0u8; length];
        let mut from_receiver = vec![0u8; length];
        sender.export(&context, &mut from_sender).unwrap();
        receiver.export(&context, &mut from_receiver).unwrap();
        assert_eq!(from_sender, hex_field(export, "exported_value"));
        assert_eq!(from_receiver, from_sender);
    }
}

#[test]
fn rfc9180_a2_x25519_chacha20poly1305_result_suite() {
    check_suite::<ResultKem>("rfc9180-A2-x25519-sha256-chacha20poly1305.txt", "32");
}

#[test]
fn rfc9180_a5_p256_chacha20poly1305_fleet_suite() {
    check_suite::<FleetKem>("rfc9180-A5-p256-sha256-chacha20poly1305.txt", "16");
}
