//! The host as attacker on the models bucket: it can delete or withhold manifests, copy an old
//! signed manifest under a newer key, and replay or withhold the publisher's minimum. Each test
//! publishes real models (local KMS, Ed25519 publisher) into a local store, tampers as the host
//! would, and asks the model choice `submit` makes (model_choice::choose_model).

use std::path::Path;

use cloud_local::kms::LocalKeyPolicy;
use cloud_local::LocalCloud;
use cloud::{layout, ObjectStore, PutCondition, Services};
use ed25519_dalek::SigningKey;
use ephem_batch_client::home::Home;
use ephem_batch_client::model::{self, PublishedModel};
use ephem_batch_client::model_choice::{self, choose_model, minimum_key, ModelChoiceError, ModelPins};

const MODEL: &str = "example/tiny-bert";
const NOW_MS: u64 = 1_760_000_000_000;
/// The running image and the one an update rolls out.
const IMAGE_A: [u8; 48] = [0xa0; 48];
const IMAGE_B: [u8; 48] = [0xb0; 48];

fn tiny_model(dir: &Path) {
    std::fs::write(dir.join("config.json"), br#"{"model_type": "bert", "hidden_size": 8, "max_position_embeddings": 512}"#)
        .unwrap();
    std::fs::write(dir.join("sentence_bert_config.json"), br#"{"max_seq_length": 256}"#).unwrap();
    std::fs::write(dir.join("tokenizer.json"), br#"{"version": "1.0"}"#).unwrap();
    std::fs::write(dir.join("model.safetensors"), vec![7u8; 4096]).unwrap();
}

struct World {
    dirs: std::cell::RefCell<Vec<tempfile::TempDir>>,
    services: Services,
    model_dir: std::path::PathBuf,
    publisher: SigningKey,
}

impl World {
    fn new() -> World {
        let (cloud_dir, model_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        tiny_model(model_dir.path());
        let cloud = LocalCloud::open(cloud_dir.path()).unwrap();
        // The model key only the (development) enclave image may use, as `dev up` creates it.
        let kms = cloud.kms();
        let key = kms.create_key(LocalKeyPolicy::model(vec![0x11; 48], None), "models (test)").unwrap();
        kms.set_alias(cloud_local::MODEL_KEY_ALIAS, &key).unwrap();
        let services = cloud.services();
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).unwrap();
        World { model_dir: model_dir.path().to_owned(), dirs: vec![cloud_dir, model_dir].into(), services, publisher: SigningKey::from_bytes(&seed) }
    }

    fn models(&self) -> &dyn ObjectStore {
        self.services.models.as_ref()
    }

    fn publish(&self, version: u64) -> PublishedModel {
        let s = &self.services;
        model::publish(&self.model_dir, MODEL, version, s.kms.as_ref(), &s.keys.model, &self.publisher, self.models()).unwrap()
    }

    /// A fresh client home (no ratchet yet).
    fn home(&self) -> Home {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::resolve(Some(dir.path())).unwrap();
        self.dirs.borrow_mut().push(dir);
        home
    }

    /// A version sealed for the images `images` (`model encrypt --for-image`).
    fn publish_for(&self, version: u64, images: &[[u8; 48]]) -> PublishedModel {
        let s = &self.services;
        let offering = model::Offering { images: images.to_vec(), ..model::Offering::default() };
        model::publish_offering(&self.model_dir, MODEL, version, &offering, s.kms.as_ref(), &s.keys.model, &self.publisher, self.models())
            .unwrap()
    }

    fn choose(&self, home: &Home, pins: ModelPins) -> Result<model_choice::CheckedModel, ModelChoiceError> {
        self.choose_for(home, pins, &IMAGE_A)
    }

    /// The choice of a client that attested the image measured `pcr0`.
    fn choose_for(&self, home: &Home, pins: ModelPins, pcr0: &[u8; 48]) -> Result<model_choice::CheckedModel, ModelChoiceError> {
        choose_model(self.models(), MODEL, &self.publisher.verifying_key(), home, &pins, pcr0)
    }

    fn set_minimum(&self, version: u64) {
        let signed = model_choice::sign_minimum(MODEL, version, &self.publisher, NOW_MS);
        model_choice::upload_minimum(self.models(), &signed).unwrap();
    }
}

fn refused(result: Result<model_choice::CheckedModel, ModelChoiceError>, check: &str) -> String {
    let error = match result {
        Ok(chosen) => panic!("expected check `{check}` to refuse, chose v{} ({})", chosen.manifest.version, chosen.key),
        Err(error) => error,
    };
    assert_eq!(error.check(), Some(check), "{error}");
    let text = error.to_string();
    assert!(text.contains(&format!("check `{check}` failed")), "{text}");
    text
}

fn version(result: Result<model_choice::CheckedModel, ModelChoiceError>) -> u64 {
    result.unwrap_or_else(|e| panic!("refused: {e}")).manifest.version
}

#[test]
fn submit_refuses_a_manifest_whose_signed_version_differs_from_its_key() {
    let world = World::new();
    let v1 = world.publish(1);
    let v2 = world.publish(2);
    let home = world.home();
    assert_eq!(version(world.choose(&world.home(), ModelPins::default())), 2, "the untouched store gives v2");

    // The host replaces v2's manifest with v1's signed bytes: every signature still verifies.
    let v1_bytes = world.models().get(&v1.manifest_key).unwrap();
    world.models().delete(&v2.manifest_key).unwrap();
    world.models().put(&v2.manifest_key, &v1_bytes, PutCondition::CreateOnly).unwrap();
    let text = refused(world.choose(&home, ModelPins::default()), "model_version");
    assert!(text.contains(&v2.manifest_key) && text.contains("signed as version 1, not 2"), "{text}");
    // Pinning does not route around a tampered listing.
    refused(world.choose(&home, ModelPins { version: Some(1), manifest_sha256: None }), "model_version");

    // The same copy under a version never published (v9) is refused too.
    world.models().delete(&v2.manifest_key).unwrap();
    world.models().put(&layout::model_manifest(MODEL, 9), &v1_bytes, PutCondition::CreateOnly).unwrap();
    refused(world.choose(&world.home(), ModelPins::default()), "model_version");
}

#[test]
fn a_manifest_below_the_signed_minimum_is_refused() {
    let world = World::new();
    let _v1 = world.publish(1);
    let v2 = world.publish(2);
    world.set_minimum(2);
    assert_eq!(version(world.choose(&world.home(), ModelPins::default())), 2);

    // The host deletes v2: a client that never saw it still refuses v1, by the signed minimum.
    world.models().delete(&v2.manifest_key).unwrap();
    let text = refused(world.choose(&world.home(), ModelPins::default()), "model_minimum");
    assert!(text.contains("v1 is below the publisher's signed minimum v2 (published)"), "{text}");
    // An explicit pin does not go below the publisher's minimum either.
    refused(world.choose(&world.home(), ModelPins { version: Some(1), manifest_sha256: None }), "model_minimum");

    // A minimum the publisher did not sign is refused, not ignored.
    let stranger = SigningKey::from_bytes(&[0x5a; 32]);
    let forged = model_choice::sign_minimum(MODEL, 1, &stranger, NOW_MS);
    world.models().put(&minimum_key(MODEL), &forged, PutCondition::Overwrite).unwrap();
    let text = refused(world.choose(&world.home(), ModelPins::default()), "model_minimum");
    assert!(text.contains(&minimum_key(MODEL)), "{text}");
    // Nor is a manifest signature accepted in the minimum's place.
    let v1_bytes = world.models().get(&layout::model_manifest(MODEL, 1)).unwrap();
    world.models().put(&minimum_key(MODEL), &v1_bytes, PutCondition::Overwrite).unwrap();
    refused(world.choose(&world.home(), ModelPins::default()), "model_minimum");
}

#[test]
fn publishing_a_minimum_never_lowers_it_nor_names_an_unpublished_version() {
    let world = World::new();
    world.publish(1);
    world.publish(2);
    let unpublished = model_choice::sign_minimum(MODEL, 3, &world.publisher, NOW_MS);
    let error = model_choice::upload_minimum(world.models(), &unpublished).unwrap_err();
    assert!(matches!(error, model_choice::MinimumUploadError::NotPublished { version: 3, .. }), "{error}");
    world.set_minimum(2);
    let lower = model_choice::sign_minimum(MODEL, 1, &world.publisher, NOW_MS + 1);
    let error = model_choice::upload_minimum(world.models(), &lower).unwrap_err();
    assert!(matches!(error, model_choice::MinimumUploadError::Lower { existing: 2, new: 1, .. }), "{error}");
}

#[test]
fn after_seeing_v2_a_client_refuses_v1_when_v2_is_withheld() {
    let world = World::new();
    let v1 = world.publish(1);
    let v2 = world.publish(2);
    let home = world.home();
    assert_eq!(version(world.choose(&home, ModelPins::default())), 2);

    // No minimum was ever published; the host deletes v2.
    world.models().delete(&v2.manifest_key).unwrap();
    let text = refused(world.choose(&home, ModelPins::default()), "model_ratchet");
    assert!(text.contains(&hex::encode(v2.manifest_hash)) && text.contains(&hex::encode(v1.manifest_hash)), "{text}");
    // A client without that memory cannot tell (the signed minimum is what covers it).
    assert_eq!(version(world.choose(&world.home(), ModelPins::default())), 1);
    // Going back deliberately takes a pin.
    assert_eq!(version(world.choose(&home, ModelPins { version: Some(1), manifest_sha256: None })), 1);

    // Another v2 signed by the same publisher (re-encrypted: other bytes) under v2's key.
    let elsewhere = World { publisher: world.publisher.clone(), ..World::new() };
    let other_v2 = elsewhere.publish(2);
    assert_ne!(other_v2.manifest_hash, v2.manifest_hash);
    let other_bytes = elsewhere.models().get(&other_v2.manifest_key).unwrap();
    world.models().put(&v2.manifest_key, &other_bytes, PutCondition::CreateOnly).unwrap();
    refused(world.choose(&home, ModelPins::default()), "model_ratchet");
}

/// During an image update the newest version is sealed to the new image's model key: a client
/// that attested the old image must keep sealing to the old image's version (the old enclaves
/// cannot open the new one, the new ones cannot open the old epoch), and the ratchet of one
/// image's versions does not hold the other's back.
#[test]
fn a_client_seals_to_the_newest_version_for_the_image_it_attested() {
    let world = World::new();
    let v1 = world.publish_for(1, &[IMAGE_A]);
    let home = world.home();
    assert_eq!(version(world.choose_for(&home, ModelPins::default(), &IMAGE_A)), 1);
    let v2 = world.publish_for(2, &[IMAGE_B]);
    assert_eq!(world.choose_for(&home, ModelPins::default(), &IMAGE_A).unwrap().hash, v1.manifest_hash, "v2 is for image B only");
    assert_eq!(world.choose_for(&home, ModelPins::default(), &IMAGE_B).unwrap().hash, v2.manifest_hash);
    // Both remembered: the old image's clients are not refused for having seen v2, and a host
    // that withholds v2 from a client of image B is still caught.
    assert_eq!(version(world.choose_for(&home, ModelPins::default(), &IMAGE_A)), 1);
    // A pin cannot reach across images.
    refused(world.choose_for(&home, ModelPins { version: Some(1), manifest_sha256: None }, &IMAGE_B), "model_pin");
    world.models().delete(&v2.manifest_key).unwrap();
    let text = refused(world.choose_for(&home, ModelPins::default(), &IMAGE_B), "model_image");
    assert!(text.contains(&hex::encode(IMAGE_A)), "{text}");
    // A version naming no image is for every image.
    world.publish(3);
    assert_eq!(version(world.choose_for(&home, ModelPins::default(), &IMAGE_B)), 3);
    assert_eq!(version(world.choose_for(&home, ModelPins::default(), &IMAGE_A)), 3);
}

#[test]
fn a_minimum_seen_once_outlives_its_object() {
    let world = World::new();
    world.publish(1);
    let v2 = world.publish(2);
    world.set_minimum(2);
    let home = world.home();
    assert_eq!(version(world.choose(&home, ModelPins::default())), 2);

    // The host withholds both the minimum and v2; even a pin to v1 is refused by this client.
    world.models().delete(&minimum_key(MODEL)).unwrap();
    world.models().delete(&v2.manifest_key).unwrap();
    let text = refused(world.choose(&home, ModelPins { version: Some(1), manifest_sha256: None }), "model_minimum");
    assert!(text.contains("remembered by this client"), "{text}");
}

#[test]
fn pins_accept_the_pinned_manifest_and_refuse_others() {
    let world = World::new();
    let v1 = world.publish(1);
    let v2 = world.publish(2);
    let home = world.home();
    let by_version = |v| ModelPins { version: Some(v), manifest_sha256: None };
    let by_hash = |h| ModelPins { version: None, manifest_sha256: Some(h) };

    let chosen = world.choose(&home, by_version(1)).unwrap();
    assert_eq!((chosen.manifest.version, chosen.hash, chosen.key.as_str()), (1, v1.manifest_hash, v1.manifest_key.as_str()));
    assert_eq!(world.choose(&home, by_hash(v1.manifest_hash)).unwrap().hash, v1.manifest_hash);
    assert_eq!(world.choose(&home, by_hash(v2.manifest_hash)).unwrap().manifest.version, 2);
    let both = ModelPins { version: Some(2), manifest_sha256: Some(v2.manifest_hash) };
    assert_eq!(world.choose(&home, both).unwrap().hash, v2.manifest_hash);

    refused(world.choose(&home, by_version(3)), "model_pin");
    refused(world.choose(&home, by_hash([0xab; 32])), "model_pin");
    refused(world.choose(&home, ModelPins { version: Some(2), manifest_sha256: Some(v1.manifest_hash) }), "model_pin");
    // The pinned version withheld by the host: refused, not replaced by another.
    world.models().delete(&v1.manifest_key).unwrap();
    refused(world.choose(&home, by_version(1)), "model_pin");
    refused(world.choose(&home, by_hash(v1.manifest_hash)), "model_pin");

    let parsed = ModelPins::parse(Some(2), Some(&hex::encode(v2.manifest_hash))).unwrap();
    assert_eq!(parsed, both);
    assert_eq!(ModelPins::parse(None, Some("abcd")).unwrap_err().check(), Some("model_pin"));
}
