//! Against an independent implementation of RFC 9458 (the `ohttp` crate, its own HPKE): each side
//! of ours talks to the other side of theirs, over a P-256 key both derive from the same IKM
//! (RFC 9180 DeriveKeyPair).

use ohttp::hpke::{Aead, Kdf, Kem as TheirKem};
use ohttp::{ClientRequest, KeyConfig as TheirConfig, Server, SymmetricSuite};

use super::*;

const IKM: [u8; 32] = [7; 32];
const EPOCH: u64 = 258;

fn ours() -> (FleetSecretKey, KeyConfig) {
    let secret = FleetSecretKey::derive_from_ikm(&IKM);
    let config = KeyConfig::for_epoch(EPOCH, secret.public_key());
    (secret, config)
}

fn theirs() -> Server {
    let suites = vec![SymmetricSuite::new(Kdf::HkdfSha256, Aead::ChaCha20Poly1305)];
    let config = TheirConfig::derive(key_id(EPOCH), TheirKem::P256Sha256, suites, &IKM).unwrap();
    Server::new(config).unwrap()
}

#[test]
fn the_key_configuration_is_encoded_as_rfc_9458_says() {
    let (_, config) = ours();
    assert_eq!(config.key_id, 2, "epoch 258 mod 256");
    let their_config =
        TheirConfig::derive(2, TheirKem::P256Sha256, vec![SymmetricSuite::new(Kdf::HkdfSha256, Aead::ChaCha20Poly1305)], &IKM)
            .unwrap();
    assert_eq!(config.encode(), their_config.encode().unwrap());
    assert_eq!(KeyConfig::decode(&config.encode()).unwrap(), config);
    let list = config.encode_list();
    assert_eq!(&list[..2], &(config.encode().len() as u16).to_be_bytes());
}

#[test]
fn their_client_talks_to_our_gateway() {
    let (secret, config) = ours();
    let client = ClientRequest::from_encoded_config(&config.encode()).unwrap();
    let (encapsulated, pending) = client.encapsulate(b"POST /v1/embeddings").unwrap();
    assert_eq!(request_key_id(&encapsulated).unwrap(), 2);
    let (request, sealer) = decapsulate_request(&secret, 2, &encapsulated).unwrap();
    assert_eq!(request, b"POST /v1/embeddings");
    let response = sealer.seal(b"200 vectors").unwrap();
    assert_eq!(pending.decapsulate(&response).unwrap(), b"200 vectors");
}

#[test]
fn our_client_talks_to_their_gateway() {
    let (_, config) = ours();
    let server = theirs();
    let (encapsulated, opener) = encapsulate_request(&config, b"query text").unwrap();
    let (request, response) = server.decapsulate(&encapsulated).unwrap();
    assert_eq!(request, b"query text");
    let answer = response.encapsulate(b"vector").unwrap();
    assert_eq!(opener.open(&answer).unwrap(), b"vector");
}

#[test]
fn a_flipped_bit_anywhere_in_a_request_is_refused_by_the_check_it_breaks() {
    let (secret, config) = ours();
    let (encapsulated, _) = encapsulate_request(&config, b"canary text").unwrap();
    for index in 0..encapsulated.len() {
        let mut tampered = encapsulated.clone();
        tampered[index] ^= 1;
        let error = decapsulate_request(&secret, 2, &tampered).err().expect("tampered request opened");
        let expected = match index {
            0 => matches!(error, OhttpError::UnknownKeyId { found: 3, expected: 2 }),
            1..=6 => matches!(error, OhttpError::UnsupportedSuite { .. }),
            _ => matches!(error, OhttpError::EncapsulatedKey | OhttpError::RequestAuthentication),
        };
        assert!(expected, "byte {index}: {error}");
    }
    assert_eq!(decapsulate_request(&secret, 2, &encapsulated[..70]).err(), Some(OhttpError::RequestTooShort(70)));
}

#[test]
fn a_request_sealed_to_another_key_does_not_open() {
    let (_, config) = ours();
    let other = FleetSecretKey::generate();
    let (encapsulated, _) = encapsulate_request(&config, b"text").unwrap();
    assert_eq!(decapsulate_request(&other, 2, &encapsulated).err(), Some(OhttpError::RequestAuthentication));
}

#[test]
fn a_response_opens_only_for_its_own_request_and_untampered() {
    let (secret, config) = ours();
    let (first, first_opener) = encapsulate_request(&config, b"one").unwrap();
    let (second, _) = encapsulate_request(&config, b"two").unwrap();
    let (_, first_sealer) = decapsulate_request(&secret, 2, &first).unwrap();
    let (_, second_sealer) = decapsulate_request(&secret, 2, &second).unwrap();
    assert_ne!(first_sealer.encapsulated_key(), second_sealer.encapsulated_key());

    let answer = first_sealer.seal(b"answer one").unwrap();
    assert_eq!(first_opener.open(&answer).unwrap(), b"answer one");
    let misdirected = second_sealer.seal(b"answer two").unwrap();
    assert_eq!(first_opener.open(&misdirected).err(), Some(OhttpError::ResponseAuthentication));
    for index in [0, 31, 32, answer.len() - 1] {
        let mut tampered = answer.clone();
        tampered[index] ^= 0x80;
        assert_eq!(first_opener.open(&tampered).err(), Some(OhttpError::ResponseAuthentication), "byte {index}");
    }
    assert_eq!(first_opener.open(&answer[..40]).err(), Some(OhttpError::ResponseTooShort(40)));
}

#[test]
fn responses_are_fresh_each_time() {
    let (secret, config) = ours();
    let (encapsulated, _) = encapsulate_request(&config, b"x").unwrap();
    let (_, sealer) = decapsulate_request(&secret, 2, &encapsulated).unwrap();
    assert_ne!(sealer.seal(b"same").unwrap(), sealer.seal(b"same").unwrap());
    let fixed = sealer.seal_with_nonce(b"same", &[9; RESPONSE_NONCE_LEN]).unwrap();
    assert_eq!(fixed.len(), RESPONSE_NONCE_LEN + 4 + TAG_LEN);
}

#[test]
fn other_key_configurations_are_refused_by_name() {
    let (_, config) = ours();
    let mut bytes = config.encode();
    bytes[2] = 0x20; // X25519
    assert_eq!(KeyConfig::decode(&bytes).err(), Some(OhttpError::KeyConfig("KEM is not DHKEM(P-256, HKDF-SHA256)")));
    let mut bytes = config.encode();
    let last = bytes.len() - 1;
    bytes[last] = 1; // AES-128-GCM
    assert!(matches!(KeyConfig::decode(&bytes), Err(OhttpError::KeyConfig(_))));
    assert!(KeyConfig::decode(&config.encode()[..20]).is_err());
}
