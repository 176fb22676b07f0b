//! KMS `CiphertextForRecipient` envelopes (CMS EnvelopedData, BER): arbitrary bytes through the
//! enclave's BER reader, and, when the envelope names the fixed one-shot RSA key (the generated
//! seeds do; the real KMS fixture names another key), through RSA-OAEP and AES-256-CBC.
//! Checks: an accepted envelope has no accepted proper prefix, its fields have the profile's
//! shape, decryption fails only with the two decryption errors, and what decrypts re-seals to an
//! envelope that opens to the same plaintext.
#![no_main]

use ephem_fuzz::fixed::{self, HashRng};
use libfuzzer_sys::fuzz_target;
use protocol::cms::{self, CmsError, EnvelopedData};

fuzz_target!(|data: &[u8]| {
    let Ok(envelope) = EnvelopedData::parse(data) else { return };
    assert!(EnvelopedData::parse(&data[..data.len() - 1]).is_err(), "a proper prefix parses too");
    assert!(!envelope.encrypted_content.is_empty() && envelope.encrypted_content.len() % 16 == 0);
    if envelope.subject_key_identifier != cms::subject_key_identifier(fixed::rsa_spki()) {
        return;
    }
    match envelope.decrypt(fixed::rsa_key()) {
        Ok(plaintext) => {
            assert!(plaintext.len() < envelope.encrypted_content.len());
            let resealed = cms::seal(fixed::rsa_spki(), &plaintext, &mut HashRng::new("reseal")).expect("reseal");
            assert_eq!(*cms::open(&resealed, fixed::rsa_key()).expect("open the resealed envelope"), *plaintext);
        }
        Err(CmsError::KeyUnwrap | CmsError::ContentDecryption) => {}
        Err(other) => panic!("decryption failed with a parse-stage error: {other}"),
    }
});
