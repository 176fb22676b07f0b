use super::*;
use protocol::manifest::Pooling;
use cloud::kms::{DataKey, DataKeyPair, Decrypted, Recipient};
use cloud::objects::{ObjectMeta, ObjectWriter};
use protocol::stream::StreamOpener;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

const KEY: &str = "alias/models";

/// A wrapped key: (KMS key id, encryption context, plaintext).
type Wrapped = (String, EncryptionContext, Vec<u8>);

/// KMS `Encrypt`/`Decrypt` with the context check, in memory.
#[derive(Default)]
struct MemKms {
    blobs: Mutex<HashMap<Vec<u8>, Wrapped>>,
}

impl Kms for MemKms {
    fn enclave_access(&self) -> Result<cloud::AwsCredentials, KmsError> {
        Err(KmsError::Validation("not in this test".into()))
    }

    fn encrypt(&self, key_id: &str, plaintext: &[u8], context: &EncryptionContext) -> Result<Vec<u8>, KmsError> {
        if key_id != KEY {
            return Err(KmsError::NotFound { key_id: key_id.into() });
        }
        let mut blob = vec![0u8; 48];
        getrandom::fill(&mut blob).unwrap();
        self.blobs.lock().unwrap().insert(blob.clone(), (key_id.into(), context.clone(), plaintext.to_vec()));
        Ok(blob)
    }

    fn generate_data_key(
        &self,
        _: &str,
        _: &EncryptionContext,
        _: Option<&Recipient>,
    ) -> Result<DataKey, KmsError> {
        Err(KmsError::Validation("not in this test".into()))
    }

    fn generate_data_key_pair_without_plaintext(
        &self,
        _: &str,
        _: &EncryptionContext,
    ) -> Result<DataKeyPair, KmsError> {
        Err(KmsError::Validation("not in this test".into()))
    }

    fn decrypt(
        &self,
        _: Option<&str>,
        blob: &[u8],
        context: &EncryptionContext,
        _: Option<&Recipient>,
    ) -> Result<Decrypted, KmsError> {
        let blobs = self.blobs.lock().unwrap();
        let (key_id, bound, plaintext) =
            blobs.get(blob).ok_or_else(|| KmsError::InvalidCiphertext("unknown".into()))?;
        if bound != context {
            return Err(KmsError::InvalidCiphertext("context differs".into()));
        }
        Ok(Decrypted {
            key_id: key_id.clone(),
            plaintext: Some(Zeroizing::new(plaintext.clone())),
            ciphertext_for_recipient: None,
        })
    }
}

type Objects = Arc<Mutex<BTreeMap<String, Vec<u8>>>>;

#[derive(Default)]
struct MemStore {
    objects: Objects,
}

struct MemWriter {
    objects: Objects,
    key: String,
    bytes: Vec<u8>,
}

impl Write for MemWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.bytes.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn meta(key: &str, bytes: &[u8]) -> ObjectMeta {
    ObjectMeta {
        key: key.into(),
        size: bytes.len() as u64,
        etag: hex::encode(&Sha256::digest(bytes)[..8]),
        modified_ms: 0,
    }
}

impl ObjectWriter for MemWriter {
    fn commit(self: Box<Self>) -> Result<ObjectMeta, ObjectError> {
        let meta = meta(&self.key, &self.bytes);
        self.objects.lock().unwrap().insert(self.key, self.bytes);
        Ok(meta)
    }
}

impl ObjectStore for MemStore {
    fn put(&self, key: &str, bytes: &[u8], condition: PutCondition) -> Result<ObjectMeta, ObjectError> {
        let mut objects = self.objects.lock().unwrap();
        if condition == PutCondition::CreateOnly && objects.contains_key(key) {
            return Err(ObjectError::AlreadyExists { key: key.into() });
        }
        objects.insert(key.into(), bytes.to_vec());
        Ok(meta(key, bytes))
    }

    fn writer(&self, key: &str, _: PutCondition) -> Result<Box<dyn ObjectWriter>, ObjectError> {
        Ok(Box::new(MemWriter { objects: self.objects.clone(), key: key.into(), bytes: Vec::new() }))
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, ObjectError> {
        self.objects.lock().unwrap().get(key).cloned().ok_or_else(|| ObjectError::NotFound { key: key.into() })
    }

    fn reader(&self, key: &str) -> Result<Box<dyn Read + Send>, ObjectError> {
        Ok(Box::new(io::Cursor::new(self.get(key)?)))
    }

    fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>, ObjectError> {
        let bytes = self.get(key)?;
        let start = (offset as usize).min(bytes.len());
        Ok(bytes[start..(start + len as usize).min(bytes.len())].to_vec())
    }

    fn head(&self, key: &str) -> Result<Option<ObjectMeta>, ObjectError> {
        Ok(self.objects.lock().unwrap().get(key).map(|bytes| meta(key, bytes)))
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, ObjectError> {
        let objects = self.objects.lock().unwrap();
        Ok(objects.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(k, v)| meta(k, v)).collect())
    }

    fn delete(&self, key: &str) -> Result<(), ObjectError> {
        self.objects.lock().unwrap().remove(key);
        Ok(())
    }
}

const MODEL: &str = "example/tiny-bert";

/// A model directory with small files; the weights span several STREAM chunks.
fn tiny_model(dir: &Path) {
    std::fs::write(dir.join("config.json"), br#"{"model_type": "bert", "hidden_size": 8, "max_position_embeddings": 512}"#)
        .unwrap();
    std::fs::write(dir.join("tokenizer.json"), br#"{"version": "1.0"}"#).unwrap();
    std::fs::write(dir.join("sentence_bert_config.json"), br#"{"max_seq_length": 256}"#).unwrap();
    let weights: Vec<u8> = (0..200_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    std::fs::write(dir.join("model.safetensors"), weights).unwrap();
}

fn open_sealed(manifest: &Manifest, dek: &[u8; 32], name: &str, sealed: &[u8]) -> Vec<u8> {
    let mut opener = StreamOpener::new(&manifest.file_key(dek, name), manifest.file_stream_id(name));
    let mut plaintext = Vec::new();
    opener.push(sealed, &mut plaintext).unwrap();
    opener.finish(&mut plaintext).unwrap();
    plaintext
}

fn release_dek(kms: &MemKms, manifest: &Manifest) -> [u8; 32] {
    let context = data_key_context(&manifest.model_id, manifest.version);
    let plaintext =
        kms.decrypt(Some(&manifest.kms_key_id), &manifest.wrapped_dek, &context, None).unwrap().plaintext.unwrap();
    plaintext.as_slice().try_into().unwrap()
}

#[test]
fn encrypt_sign_upload_verify_round_trip() {
    let model = tempfile::tempdir().unwrap();
    tiny_model(model.path());
    let staging = tempfile::tempdir().unwrap();
    let out = staging.path().join("sealed");
    let (kms, store) = (MemKms::default(), MemStore::default());
    let publisher = SigningKey::from_bytes(&[7; 32]);

    let manifest = encrypt(model.path(), MODEL, 3, &kms, KEY, &out).unwrap();
    assert_eq!(
        (manifest.dimensions, manifest.max_tokens, manifest.pooling, manifest.normalize),
        (8, 256, Pooling::Mean, false)
    );
    assert_eq!(manifest.files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), MODEL_FILES);
    assert_eq!(manifest.file("model.safetensors").unwrap().size, 200_000);
    let signed = sign(&out, &publisher).unwrap();
    assert_eq!(signed.manifest, manifest);
    let key = upload(&out, &store).unwrap();
    assert_eq!(key, "models/tiny-bert/v3/manifest.cose");
    assert_eq!(upload(&out, &store).unwrap(), key, "uploading the same manifest again is a no-op");

    let stored = store.get(&key).unwrap();
    let verified = verify(&stored, &publisher.verifying_key(), Some((&store, &key))).unwrap();
    assert_eq!(verified.manifest, manifest);
    assert_eq!(verified.manifest_hash, signed.manifest_hash);

    // The DEK is released only under {model_id, version}, and opens every stored file.
    let dek = release_dek(&kms, &manifest);
    assert!(kms.decrypt(None, &manifest.wrapped_dek, &data_key_context(MODEL, 4), None).is_err());
    for name in MODEL_FILES {
        let sealed = store.get(&Manifest::file_object_key(&key, name)).unwrap();
        let plaintext = open_sealed(&manifest, &dek, name, &sealed);
        assert_eq!(plaintext, std::fs::read(model.path().join(name)).unwrap(), "{name}");
        assert_eq!(<[u8; 32]>::from(Sha256::digest(&plaintext)), manifest.file(name).unwrap().sha256);
        // Streaming seals exactly what Manifest::seal_file would.
        assert_eq!(sealed, manifest.seal_file(&dek, name, &plaintext), "{name}");
    }
}

#[test]
fn tampered_or_foreign_manifests_are_refused() {
    let model = tempfile::tempdir().unwrap();
    tiny_model(model.path());
    let out = tempfile::tempdir().unwrap();
    let (kms, store) = (MemKms::default(), MemStore::default());
    let publisher = SigningKey::from_bytes(&[7; 32]);
    encrypt(model.path(), MODEL, 1, &kms, KEY, out.path()).unwrap();
    let signed = sign(out.path(), &publisher).unwrap().signed;

    let stranger = SigningKey::from_bytes(&[8; 32]);
    assert!(matches!(verify(&signed, &stranger.verifying_key(), None), Err(ModelError::Manifest(_))));
    let position = signed.windows(8).position(|w| w == b"tiny-ber").unwrap();
    let mut tampered = signed.clone();
    tampered[position] ^= 0x01;
    assert!(matches!(verify(&tampered, &publisher.verifying_key(), None), Err(ModelError::Manifest(_))));
    let mut truncated = signed.clone();
    truncated.pop();
    assert!(verify(&truncated, &publisher.verifying_key(), None).is_err());

    // Not uploaded yet, then at the wrong key, then with a damaged file.
    let key = layout::model_manifest(MODEL, 1);
    assert!(matches!(
        verify(&signed, &publisher.verifying_key(), Some((&store, &key))),
        Err(ModelError::MissingObject { .. })
    ));
    upload(out.path(), &store).unwrap();
    let wrong = layout::model_manifest(MODEL, 2);
    assert!(matches!(
        verify(&signed, &publisher.verifying_key(), Some((&store, &wrong))),
        Err(ModelError::WrongKey { .. })
    ));
    let weights = Manifest::file_object_key(&key, "model.safetensors");
    let mut damaged = store.get(&weights).unwrap();
    damaged.truncate(damaged.len() - 1);
    store.put(&weights, &damaged, PutCondition::Overwrite).unwrap();
    assert!(matches!(
        verify(&signed, &publisher.verifying_key(), Some((&store, &key))),
        Err(ModelError::ObjectSize { .. })
    ));

    // A manifest without a file the enclave loads.
    let mut manifest = Manifest::from_payload(&std::fs::read(out.path().join(PAYLOAD_FILE)).unwrap()).unwrap();
    manifest.files.retain(|f| f.name != "tokenizer.json");
    let partial = manifest.sign(&publisher);
    assert!(matches!(
        verify(&partial, &publisher.verifying_key(), None),
        Err(ModelError::ManifestLacks("tokenizer.json"))
    ));
}

#[test]
fn a_published_version_is_never_replaced() {
    let model = tempfile::tempdir().unwrap();
    tiny_model(model.path());
    let (kms, store) = (MemKms::default(), MemStore::default());
    let publisher = SigningKey::from_bytes(&[7; 32]);
    let first = tempfile::tempdir().unwrap();
    encrypt(model.path(), MODEL, 1, &kms, KEY, first.path()).unwrap();
    sign(first.path(), &publisher).unwrap();
    let key = upload(first.path(), &store).unwrap();
    let before = store.objects.lock().unwrap().clone();

    // Same version, new data key: refused, and nothing in the store changes.
    let second = tempfile::tempdir().unwrap();
    encrypt(model.path(), MODEL, 1, &kms, KEY, second.path()).unwrap();
    sign(second.path(), &publisher).unwrap();
    assert!(matches!(upload(second.path(), &store), Err(ModelError::VersionExists { .. })));
    assert!(matches!(
        publish(model.path(), MODEL, 1, &kms, KEY, &publisher, &store),
        Err(ModelError::VersionExists { .. })
    ));
    assert_eq!(*store.objects.lock().unwrap(), before);
    assert_eq!(latest_manifest(&store, MODEL).unwrap(), Some((key, 1)));
}

#[test]
fn sign_needs_the_sealed_files_and_encrypt_drops_a_stale_signature() {
    let model = tempfile::tempdir().unwrap();
    tiny_model(model.path());
    let out = tempfile::tempdir().unwrap();
    let kms = MemKms::default();
    let publisher = SigningKey::from_bytes(&[7; 32]);
    encrypt(model.path(), MODEL, 1, &kms, KEY, out.path()).unwrap();
    sign(out.path(), &publisher).unwrap();
    encrypt(model.path(), MODEL, 2, &kms, KEY, out.path()).unwrap();
    assert!(!out.path().join(SIGNED_FILE).exists());
    std::fs::remove_file(out.path().join("tokenizer.json.sealed")).unwrap();
    assert!(matches!(sign(out.path(), &publisher), Err(ModelError::Io { .. })));
    assert!(matches!(
        encrypt(model.path(), MODEL, 1, &kms, "alias/other", out.path()),
        Err(ModelError::Kms { .. })
    ));
    assert!(matches!(
        encrypt(model.path(), "has space", 1, &kms, KEY, out.path()),
        Err(ModelError::InvalidModelId(_))
    ));
    std::fs::remove_file(model.path().join("tokenizer.json")).unwrap();
    assert!(matches!(
        encrypt(model.path(), MODEL, 1, &kms, KEY, out.path()),
        Err(ModelError::MissingFile { name: "tokenizer.json", .. })
    ));
}

#[test]
fn the_signed_manifest_carries_the_directory_settings() {
    let model = tempfile::tempdir().unwrap();
    tiny_model(model.path());
    std::fs::remove_file(model.path().join("sentence_bert_config.json")).unwrap();
    std::fs::write(model.path().join("tokenizer_config.json"), br#"{"model_max_length": 512}"#).unwrap();
    std::fs::write(
        model.path().join("modules.json"),
        br#"[{"path": "", "type": "sentence_transformers.models.Transformer"}, {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}, {"path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]"#,
    )
    .unwrap();
    std::fs::create_dir(model.path().join("1_Pooling")).unwrap();
    std::fs::write(model.path().join("1_Pooling/config.json"), br#"{"pooling_mode": "cls"}"#).unwrap();
    std::fs::write(
        model.path().join("config_sentence_transformers.json"),
        br#"{"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "passage"}"#,
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let kms = MemKms::default();
    encrypt(model.path(), MODEL, 1, &kms, KEY, out.path()).unwrap();
    let signed = sign(out.path(), &SigningKey::from_bytes(&[7; 32])).unwrap();
    let manifest = &signed.manifest;
    assert_eq!((manifest.max_tokens, manifest.pooling, manifest.normalize), (512, Pooling::Cls, true));
    assert_eq!(manifest.prompts.get("query"), Some("query: "));
    assert_eq!(manifest.prompts.default.as_deref(), Some("passage"));
    // A refused directory writes nothing.
    std::fs::write(model.path().join("1_Pooling/config.json"), br#"{"pooling_mode": "max"}"#).unwrap();
    let refused = tempfile::tempdir().unwrap();
    assert!(matches!(
        encrypt(model.path(), MODEL, 2, &kms, KEY, refused.path()),
        Err(ModelError::Unsupported { field: "pooling_mode", .. })
    ));
    assert_eq!(std::fs::read_dir(refused.path()).unwrap().count(), 0);
}

#[test]
fn publish_and_latest_manifest() {
    let model = tempfile::tempdir().unwrap();
    tiny_model(model.path());
    let (kms, store) = (MemKms::default(), MemStore::default());
    let publisher = SigningKey::from_bytes(&[7; 32]);
    assert_eq!(latest_manifest(&store, MODEL).unwrap(), None);
    let v2 = publish(model.path(), MODEL, 2, &kms, KEY, &publisher, &store).unwrap();
    let v10 = publish(model.path(), MODEL, 10, &kms, KEY, &publisher, &store).unwrap();
    for (key, bytes) in
        [("models/tiny-bert/v99/notes.txt", b"x".as_slice()), ("models/tiny-bert-large/v50/manifest.cose", b"y")]
    {
        store.put(key, bytes, PutCondition::Overwrite).unwrap();
    }
    assert_eq!(latest_manifest(&store, MODEL).unwrap(), Some((v10.manifest_key.clone(), 10)));
    assert_eq!(latest_manifest(&store, "example/other").unwrap(), None);

    let signed = store.get(&v2.manifest_key).unwrap();
    assert_eq!(manifest_hash(&signed), v2.manifest_hash);
    let verified = verify(&signed, &publisher.verifying_key(), Some((&store, &v2.manifest_key))).unwrap();
    let dek = release_dek(&kms, &verified.manifest);
    let sealed = store.get(&Manifest::file_object_key(&v2.manifest_key, "model.safetensors")).unwrap();
    let weights = open_sealed(&verified.manifest, &dek, "model.safetensors", &sealed);
    assert_eq!(weights, std::fs::read(model.path().join("model.safetensors")).unwrap());
}

/// The real default model, when scripts/setup-model.sh has installed it.
#[test]
fn publishes_the_default_model() {
    let dir = std::env::var_os("EPHEM_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ephem/models/all-MiniLM-L6-v2"));
    if !dir.join("model.safetensors").is_file() {
        eprintln!("skipped: no model at {} (run scripts/setup-model.sh)", dir.display());
        return;
    }
    let (kms, store) = (MemKms::default(), MemStore::default());
    let publisher = protocol::manifest::development_publisher();
    let model_id = "sentence-transformers/all-MiniLM-L6-v2";
    let published = publish(&dir, model_id, 1, &kms, KEY, &publisher, &store).unwrap();
    assert_eq!(published.manifest_key, "models/all-MiniLM-L6-v2/v1/manifest.cose");
    let manifest = &published.manifest;
    assert_eq!((manifest.dimensions, manifest.max_tokens, manifest.pooling), (384, 256, Pooling::Mean));
    assert_eq!(
        hex::encode(manifest.file("model.safetensors").unwrap().sha256),
        "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
    );
    let signed = store.get(&published.manifest_key).unwrap();
    verify(&signed, &publisher.verifying_key(), Some((&store, &published.manifest_key))).unwrap();
    let dek = release_dek(&kms, manifest);
    let sealed = store.get(&Manifest::file_object_key(&published.manifest_key, "tokenizer.json")).unwrap();
    let tokenizer = open_sealed(manifest, &dek, "tokenizer.json", &sealed);
    assert_eq!(<[u8; 32]>::from(Sha256::digest(&tokenizer)), manifest.file("tokenizer.json").unwrap().sha256);
}
