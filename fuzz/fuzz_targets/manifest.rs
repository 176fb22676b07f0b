//! Model manifests: arbitrary bytes as a signed manifest, decoded and verified with the
//! development publisher key (the seeds are signed with it). Checks: strict decoding (the payload
//! re-encodes to its bytes), the manifest hash is SHA-256 of the bytes, and a re-signed manifest
//! decodes and verifies to the same content.
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::cose::Sign1;
use protocol::manifest::{self, CONTENT_TYPE, SignedManifest};

fuzz_target!(|data: &[u8]| {
    let Ok(signed) = SignedManifest::decode(data) else { return };
    let publisher = manifest::development_publisher();
    let _ = signed.verify(&publisher.verifying_key());
    assert_eq!(signed.hash, manifest::manifest_hash(data));
    let payload = Sign1::decode(data, CONTENT_TYPE).expect("decoded once").payload;
    assert_eq!(signed.manifest.to_payload(), payload, "the manifest payload has a second encoding");
    for file in &signed.manifest.files {
        assert_eq!(signed.manifest.file(&file.name), Some(file));
    }
    let resigned = signed.manifest.sign(&publisher);
    let again = SignedManifest::decode(&resigned).expect("a re-signed manifest decodes");
    assert_eq!(again.manifest, signed.manifest);
    again.verify(&publisher.verifying_key()).expect("a re-signed manifest verifies");
});
