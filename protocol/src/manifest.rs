//! Signed model manifests (DESIGN.md §7): which files make up a model, their hashes, how to pool
//! and normalise, and how its weights are encrypted. The model publisher signs a manifest with an
//! Ed25519 key that is compiled into the enclave image; a job header pins the manifest's hash, so
//! a host cannot serve an older signed manifest instead.
//!
//! Encrypted model files use the [STREAM](crate::stream) layer with
//! key = HKDF-SHA256(ikm = DEK, salt = "", info = "ephem-batch/v1 model file" ‖ 0x00 ‖ model id ‖
//! 0x00 ‖ file name) and stream id = first 16 bytes of SHA-256("ephem-batch/v1 model stream" ‖
//! 0x00 ‖ model id ‖ 0x00 ‖ version (u64 BE) ‖ file name).

use ciborium::Value;
use ed25519_dalek::{SigningKey, VerifyingKey};
use hkdf::Hkdf;
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::cbor::{self, CborError, MapBuilder, MapReader};
use crate::cose::{self, CoseError, Sign1};
use crate::envelope::valid_model_id;
pub use crate::envelope::valid_prompt_name;
use crate::keys::KeyId;
use crate::stream::StreamId;

pub const CONTENT_TYPE: &str = "application/vnd.ephem-batch.model-manifest.v1+cbor";
pub const MAX_FILES: usize = 64;
/// Prompts a manifest may carry, and the size of each prompt's text.
pub const MAX_PROMPTS: usize = 32;
pub const MAX_PROMPT_BYTES: usize = 4096;
/// Matryoshka lengths a manifest may offer.
pub const MAX_MATRYOSHKA: usize = 32;
/// At most this many images a model version names (an update overlaps two).
pub const MAX_IMAGES: usize = 8;
/// sentence-transformers `Dense` modules a model may have after its pooling.
pub const MAX_DENSE: usize = 8;

/// bge-m3's lexical head (`sparse_linear.pt`, a `Linear(hidden, 1)` with bias), sealed as
/// safetensors with the tensors `weight` `[1, hidden]` and `bias` `[1]`: listed exactly when the
/// manifest's `outputs` offer `sparse` besides its dense vectors.
pub const LEXICAL_HEAD_FILE: &str = "sparse_linear.safetensors";
/// bge-m3's ColBERT head (`colbert_linear.pt`, a `Linear(hidden, d)` with bias), sealed as
/// safetensors with `weight` `[d, hidden]` and `bias` `[d]`: listed exactly when `outputs` offer
/// `multivector`.
pub const COLBERT_HEAD_FILE: &str = "colbert_linear.safetensors";

/// The two files Dense module `index` (in pipeline order, from 0) is sealed as: its
/// `config.json` and its weights. A directory's `2_Dense/config.json` is not a file name here
/// (no `/`), and the module's place in the pipeline must not depend on a directory name.
pub fn dense_file_names(index: usize) -> [String; 2] {
    [format!("dense.{index}.config.json"), format!("dense.{index}.safetensors")]
}


/// The model's named prompts (sentence-transformers `prompts`, `default_prompt_name`): text the
/// model expects before a query or passage. Absent from the payload when there are none, so
/// manifests from before the field decode unchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prompts {
    /// (name, text), sorted by name, names unique.
    pub entries: Vec<(String, String)>,
    /// One of the entries' names.
    pub default: Option<String>,
}

/// The prompt name that asks for no prompt even where the model has a default one
/// (`submit --prompt none`, online `prompt_name: "none"`).
pub const NO_PROMPT: &str = "none";

impl Prompts {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, text)| text.as_str())
    }

    /// The prompt a request applies, as sentence-transformers chooses it: the one it names,
    /// none for [`NO_PROMPT`], the default when it names none. Whether the name is one of
    /// `entries` is the caller's check.
    pub fn chosen<'a>(&'a self, asked: Option<&'a str>) -> Option<&'a str> {
        match asked {
            None => self.default.as_deref(),
            Some(NO_PROMPT) => None,
            Some(name) => Some(name),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest envelope: {0}")]
    Cose(#[from] CoseError),
    #[error("manifest payload: {0}")]
    Payload(#[from] CborError),
    #[error("manifest invalid: {0}")]
    Invalid(&'static str),
}

/// How token vectors become one text vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// Mean over the tokens the attention mask marks as real.
    Mean,
    /// The first token's vector.
    Cls,
    /// The last token's vector (decoder embedders: Qwen3-Embedding).
    LastToken,
    /// SPLADE: the masked-language-model logits of every token, `log(1 + ReLU(·))`, the maximum
    /// over the tokens per vocabulary entry: one weight per vocabulary entry, most of them zero
    /// (sentence-transformers' `SpladePooling` "max" / "relu"). Its jobs ask for sparse output.
    Splade,
    /// A cross-encoder: each (query, document) pair is one sequence, and its first token's state
    /// through the sequence-classification head (one label) is the pair's relevance; `sigmoid`:
    /// squashed to (0, 1), as sentence-transformers' `CrossEncoder` does by default. Its jobs ask
    /// for scores ([`crate::envelope::OutputKind::Scores`]).
    Rerank { sigmoid: bool },
    /// A decoder reranker (Qwen3-Reranker): each (query, document) pair rendered through the
    /// manifest's [`RerankTemplate`], and the last token's final state scored by the language
    /// model's "yes" row less its "no" row (sentence-transformers' `LogitScore`); `sigmoid`: squashed
    /// to (0, 1) as `CrossEncoder` does by default, P("yes") of a softmax over the two. Its jobs ask
    /// for scores.
    RerankYesNo { sigmoid: bool },
    /// ColBERT: every real token's final state through the token-level Dense module (sealed as
    /// `dense.0.*`), each L2-normalised, one vector per token (sentence-transformers'
    /// `MultiVectorEncoder` without a skiplist or query expansion). `dimensions` is the
    /// projection's width. Its jobs ask for multi-vector output.
    MultiVector,
}

impl Pooling {
    /// Every pooling, in the order the manifest format gained them.
    pub const ALL: [Pooling; 9] = [
        Pooling::Mean,
        Pooling::Cls,
        Pooling::LastToken,
        Pooling::Splade,
        Pooling::Rerank { sigmoid: true },
        Pooling::Rerank { sigmoid: false },
        Pooling::MultiVector,
        Pooling::RerankYesNo { sigmoid: true },
        Pooling::RerankYesNo { sigmoid: false },
    ];

    /// The pooling a manifest names `name` ([`Pooling::as_str`]'s inverse).
    pub fn from_name(name: &str) -> Option<Pooling> {
        Self::ALL.into_iter().find(|p| p.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::LastToken => "lasttoken",
            Pooling::Splade => "splade",
            Pooling::Rerank { sigmoid: true } => "rerank",
            Pooling::Rerank { sigmoid: false } => "rerank_logit",
            Pooling::MultiVector => "multivector",
            Pooling::RerankYesNo { sigmoid: true } => "rerank_yesno",
            Pooling::RerankYesNo { sigmoid: false } => "rerank_yesno_logit",
        }
    }

    /// What a job over a model pooled this way gets: one vector per text, or its sparse form.
    pub fn output(self) -> crate::envelope::OutputKind {
        match self {
            Pooling::Splade => crate::envelope::OutputKind::Sparse,
            Pooling::Rerank { .. } | Pooling::RerankYesNo { .. } => crate::envelope::OutputKind::Scores,
            Pooling::MultiVector => crate::envelope::OutputKind::MultiVector,
            Pooling::Mean | Pooling::Cls | Pooling::LastToken => crate::envelope::OutputKind::Dense,
        }
    }
}

/// How a decoder reranker ([`Pooling::RerankYesNo`]) sees a pair: its chat template reduced at
/// onboarding to fixed text around the instruction, the query and the document —
/// `prefix ‖ instruction ‖ after_instruction ‖ query ‖ after_query ‖ document ‖ suffix`, tokenized
/// whole without added special tokens — and the two vocabulary rows the score reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RerankTemplate {
    pub prefix: String,
    pub after_instruction: String,
    pub after_query: String,
    pub suffix: String,
    /// The template's default instruction (what it renders without a system message).
    pub instruction: String,
    /// The token whose logit says relevant ("yes") and the one that says not ("no").
    pub yes: u32,
    pub no: u32,
}

impl RerankTemplate {
    /// The pair as the template renders it.
    pub fn render(&self, query: &str, document: &str) -> String {
        let Self { prefix, instruction, after_instruction, after_query, suffix, .. } = self;
        format!("{prefix}{instruction}{after_instruction}{query}{after_query}{document}{suffix}")
    }

    fn to_value(&self) -> Value {
        MapBuilder::new()
            .text("prefix", &self.prefix)
            .text("after_instruction", &self.after_instruction)
            .text("after_query", &self.after_query)
            .text("suffix", &self.suffix)
            .text("instruction", &self.instruction)
            .uint("yes", u64::from(self.yes))
            .uint("no", u64::from(self.no))
            .build()
    }

    fn from_value(value: Value) -> Result<Self, ManifestError> {
        let mut map = MapReader::new(value)?;
        let token = |n: u64| u32::try_from(n).map_err(|_| ManifestError::Invalid("rerank_template token id"));
        let template = Self {
            prefix: map.text("prefix")?,
            after_instruction: map.text("after_instruction")?,
            after_query: map.text("after_query")?,
            suffix: map.text("suffix")?,
            instruction: map.text("instruction")?,
            yes: token(map.uint("yes")?)?,
            no: token(map.uint("no")?)?,
        };
        map.finish()?;
        let texts = [&template.prefix, &template.after_instruction, &template.after_query, &template.suffix, &template.instruction];
        if texts.iter().any(|t| t.len() > MAX_PROMPT_BYTES) {
            return Err(ManifestError::Invalid("rerank_template text longer than 4096 bytes"));
        }
        if template.yes == template.no {
            return Err(ManifestError::Invalid("rerank_template: yes and no are the same token"));
        }
        Ok(template)
    }
}

/// One file of a model directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFile {
    /// Plain file name, e.g. `model.safetensors`.
    pub name: String,
    /// SHA-256 of the plaintext file.
    pub sha256: [u8; 32],
    /// Plaintext size in bytes.
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub model_id: String,
    /// Increases with every re-release; the enclave refuses none by itself — job headers pin a
    /// manifest hash, which is what prevents downgrades.
    pub version: u64,
    /// Sorted by name, names unique.
    pub files: Vec<ModelFile>,
    pub dimensions: u32,
    pub pooling: Pooling,
    pub normalize: bool,
    pub max_tokens: u32,
    pub prompts: Prompts,
    /// Shorter vector lengths the model was trained to keep meaning at (Matryoshka), which a job
    /// may ask for: ascending, each below `dimensions`. Absent from the payload when empty.
    pub matryoshka: Vec<u32>,
    /// The PCR0 of each enclave image whose model key the publisher sealed this version to
    /// (ascending, at most [`MAX_IMAGES`]). Clients seal a job to the newest version for the
    /// image they attested, and hosts load it, so during an image update the old image's jobs
    /// keep naming a version the old image can open (docs/protocol.md §5.1). Empty: not said
    /// (the version is for every image). Absent from the payload when empty.
    pub images: Vec<[u8; 48]>,
    /// The output kinds the model gives besides its pooling's own, each with its vectors'
    /// dimensions, sorted by kind name: bge-m3's `sparse` (the vocabulary, through
    /// [`LEXICAL_HEAD_FILE`]) and `multivector` (the ColBERT head's width, through
    /// [`COLBERT_HEAD_FILE`]) beside its dense vectors. Absent from the payload when empty.
    pub outputs: Vec<(crate::envelope::OutputKind, u32)>,
    /// A decoder reranker's pair template and score tokens: present exactly with
    /// [`Pooling::RerankYesNo`], absent from the payload otherwise.
    pub rerank_template: Option<RerankTemplate>,
    /// KMS key that wraps the DEK.
    pub kms_key_id: String,
    /// The DEK as KMS `GenerateDataKey` returned it wrapped (CiphertextBlob), encryption context
    /// {"model_id": model id, "version": version}.
    pub wrapped_dek: Vec<u8>,
    pub created_ms: u64,
}

fn valid_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && !name.starts_with('.')
}

impl Manifest {
    pub fn to_payload(&self) -> Vec<u8> {
        let files = self
            .files
            .iter()
            .map(|f| MapBuilder::new().text("name", &f.name).bytes("sha256", &f.sha256).uint("size", f.size).build())
            .collect();
        let mut map = MapBuilder::new();
        if !self.prompts.entries.is_empty() {
            let entries = self
                .prompts
                .entries
                .iter()
                .map(|(name, text)| MapBuilder::new().text("name", name).text("text", text).build())
                .collect();
            map = map.value("prompts", Value::Array(entries));
        }
        if let Some(default) = &self.prompts.default {
            map = map.text("default_prompt", default);
        }
        if !self.matryoshka.is_empty() {
            map = map.value("matryoshka", Value::Array(self.matryoshka.iter().map(|&d| Value::from(d)).collect()));
        }
        if !self.outputs.is_empty() {
            let outputs = self.outputs.iter().fold(MapBuilder::new(), |m, &(kind, d)| m.uint(kind.as_str(), u64::from(d)));
            map = map.value("outputs", outputs.build());
        }
        if let Some(template) = &self.rerank_template {
            map = map.value("rerank_template", template.to_value());
        }
        if !self.images.is_empty() {
            map = map.value("images", Value::Array(self.images.iter().map(|pcr0| Value::Bytes(pcr0.to_vec())).collect()));
        }
        cbor::encode(
            &map
                .uint("v", 1)
                .text("model", &self.model_id)
                .uint("version", self.version)
                .value("files", Value::Array(files))
                .uint("dimensions", u64::from(self.dimensions))
                .text("pooling", self.pooling.as_str())
                .bool("normalize", self.normalize)
                .uint("max_tokens", u64::from(self.max_tokens))
                .text("kms_key", &self.kms_key_id)
                .bytes("wrapped_dek", &self.wrapped_dek)
                .uint("created_ms", self.created_ms)
                .build(),
        )
    }

    pub fn from_payload(bytes: &[u8]) -> Result<Self, ManifestError> {
        let mut map = MapReader::from_bytes(bytes)?;
        if map.uint("v")? != 1 {
            return Err(ManifestError::Invalid("unknown manifest version"));
        }
        let Value::Array(entries) = map.take("files")? else {
            return Err(CborError::WrongType("files").into());
        };
        if entries.is_empty() || entries.len() > MAX_FILES {
            return Err(ManifestError::Invalid("number of files"));
        }
        let mut files = Vec::with_capacity(entries.len());
        for entry in entries {
            let mut file = MapReader::new(entry)?;
            let parsed = ModelFile { name: file.text("name")?, sha256: file.array("sha256")?, size: file.uint("size")? };
            file.finish()?;
            if !valid_file_name(&parsed.name) {
                return Err(ManifestError::Invalid("file name"));
            }
            if files.last().is_some_and(|last: &ModelFile| last.name >= parsed.name) {
                return Err(ManifestError::Invalid("files must be sorted by name, without duplicates"));
            }
            files.push(parsed);
        }
        let pooling = Pooling::from_name(&map.text("pooling")?).ok_or(ManifestError::Invalid("unknown pooling"))?;
        let prompts = read_prompts(&mut map)?;
        let matryoshka = read_matryoshka(&mut map)?;
        let images = read_images(&mut map)?;
        let outputs = read_outputs(&mut map)?;
        let rerank_template = map.optional("rerank_template").map(RerankTemplate::from_value).transpose()?;
        let manifest = Self {
            model_id: map.text("model")?,
            version: map.uint("version")?,
            files,
            dimensions: u32::try_from(map.uint("dimensions")?).map_err(|_| ManifestError::Invalid("dimensions"))?,
            pooling,
            normalize: map.bool("normalize")?,
            max_tokens: u32::try_from(map.uint("max_tokens")?).map_err(|_| ManifestError::Invalid("max_tokens"))?,
            prompts,
            matryoshka,
            images,
            outputs,
            rerank_template,
            kms_key_id: map.text("kms_key")?,
            wrapped_dek: map.bytes("wrapped_dek")?,
            created_ms: map.uint("created_ms")?,
        };
        map.finish()?;
        if !valid_model_id(&manifest.model_id) {
            return Err(ManifestError::Invalid("model id"));
        }
        let longest = match manifest.pooling.output() {
            // A cross-encoder's dimensions are its hidden size.
            // A multi-vector model's are its projection's width.
            crate::envelope::OutputKind::Dense | crate::envelope::OutputKind::Scores | crate::envelope::OutputKind::MultiVector => {
                crate::records::MAX_DIMENSIONS
            }
            // A sparse model's dimensions are its vocabulary.
            crate::envelope::OutputKind::Sparse => crate::records::MAX_SPARSE_DIMENSIONS,
        };
        if manifest.dimensions == 0 || manifest.dimensions as usize > longest {
            return Err(ManifestError::Invalid("dimensions"));
        }
        if manifest.pooling.output() != crate::envelope::OutputKind::Dense && !manifest.matryoshka.is_empty() {
            return Err(ManifestError::Invalid("matryoshka dimensions of a model without dense vectors"));
        }
        if manifest.max_tokens == 0 {
            return Err(ManifestError::Invalid("max_tokens"));
        }
        if manifest.matryoshka.last().is_some_and(|&longest| longest >= manifest.dimensions) {
            return Err(ManifestError::Invalid("matryoshka dimensions must be below the model's dimensions"));
        }
        if manifest.rerank_template.is_some() != matches!(manifest.pooling, Pooling::RerankYesNo { .. }) {
            return Err(ManifestError::Invalid("rerank_template goes with rerank_yesno pooling, and only with it"));
        }
        let dense = manifest.dense_modules()?;
        if manifest.pooling == Pooling::MultiVector && dense != 1 {
            // The token-level projection is the one Dense module; nothing follows it.
            return Err(ManifestError::Invalid("multivector pooling: exactly one dense module, the per-token projection"));
        }
        manifest.check_outputs()?;
        Ok(manifest)
    }

    /// Each extra output has its head file and each head file its output; only a model with
    /// dense vectors has extra outputs.
    fn check_outputs(&self) -> Result<(), ManifestError> {
        use crate::envelope::OutputKind;
        if !self.outputs.is_empty() && self.pooling.output() != OutputKind::Dense {
            return Err(ManifestError::Invalid("outputs: only a model with dense vectors offers other outputs"));
        }
        for (kind, file, limit) in [
            (OutputKind::Sparse, LEXICAL_HEAD_FILE, crate::records::MAX_SPARSE_DIMENSIONS),
            (OutputKind::MultiVector, COLBERT_HEAD_FILE, crate::records::MAX_DIMENSIONS),
        ] {
            let offered = self.outputs.iter().find(|(k, _)| *k == kind);
            if offered.is_some() != self.file(file).is_some() {
                return Err(ManifestError::Invalid(match kind {
                    OutputKind::Sparse => "outputs: sparse is offered exactly when sparse_linear.safetensors is listed",
                    _ => "outputs: multivector is offered exactly when colbert_linear.safetensors is listed",
                }));
            }
            if offered.is_some_and(|&(_, d)| d == 0 || d as usize > limit) {
                return Err(ManifestError::Invalid("outputs: dimensions"));
            }
        }
        Ok(())
    }

    /// The output kinds a job over this model may ask for, each with its vectors' dimensions:
    /// the pooling's own (at `dimensions`), then `outputs`.
    pub fn offered_outputs(&self) -> Vec<(crate::envelope::OutputKind, u32)> {
        std::iter::once((self.pooling.output(), self.dimensions)).chain(self.outputs.iter().copied()).collect()
    }

    /// The dimensions of `kind`'s vectors, if the model offers that output.
    pub fn output_dimensions(&self, kind: crate::envelope::OutputKind) -> Option<u32> {
        self.offered_outputs().into_iter().find(|(k, _)| *k == kind).map(|(_, d)| d)
    }

    /// Signs with the publisher key; the SHA-256 of the result is the manifest hash.
    pub fn sign(&self, publisher: &SigningKey) -> Vec<u8> {
        cose::sign(self.to_payload(), CONTENT_TYPE, publisher)
    }

    /// Whether a job may ask for vectors of `dimensions` values: the model's own length, or one of
    /// its Matryoshka lengths.
    pub fn offers_dimensions(&self, dimensions: u32) -> bool {
        dimensions == self.dimensions || self.matryoshka.contains(&dimensions)
    }

    /// Whether this version is for the image measured `pcr0`: it names that image, or none.
    pub fn is_for_image(&self, pcr0: &[u8]) -> bool {
        self.images.is_empty() || self.images.iter().any(|image| image.as_slice() == pcr0)
    }

    /// Every length [`Manifest::offers_dimensions`] accepts, ascending.
    pub fn offered_dimensions(&self) -> Vec<u32> {
        self.matryoshka.iter().copied().chain([self.dimensions]).collect()
    }

    /// How many Dense modules follow the pooling: files `dense.0.*` to `dense.{k − 1}.*`
    /// ([`dense_file_names`]), both of each. A gap, a lone file, another `dense.` name or more
    /// than [`MAX_DENSE`] is refused, so the signed file list alone says the pipeline.
    pub fn dense_modules(&self) -> Result<usize, ManifestError> {
        let listed = self.files.iter().filter(|f| f.name.starts_with("dense.")).count();
        let modules = listed / 2;
        let complete = (0..modules).all(|i| dense_file_names(i).iter().all(|name| self.file(name).is_some()));
        if listed % 2 != 0 || modules > MAX_DENSE || !complete {
            return Err(ManifestError::Invalid("dense module files (dense.N.config.json and dense.N.safetensors from N = 0, both of each)"));
        }
        Ok(modules)
    }

    pub fn file(&self, name: &str) -> Option<&ModelFile> {
        self.files.iter().find(|f| f.name == name)
    }

    /// The STREAM key of one encrypted file.
    pub fn file_key(&self, dek: &[u8; 32], file_name: &str) -> Zeroizing<[u8; 32]> {
        let mut info = b"ephem-batch/v1 model file\0".to_vec();
        info.extend_from_slice(self.model_id.as_bytes());
        info.push(0);
        info.extend_from_slice(file_name.as_bytes());
        let mut key = Zeroizing::new([0u8; 32]);
        // 32 bytes is far below HKDF-SHA256's output limit.
        let _ = Hkdf::<Sha256>::new(Some(b""), dek).expand(&info, key.as_mut());
        key
    }

    /// Encrypts one model file for storage (publisher side).
    pub fn seal_file(&self, dek: &[u8; 32], file_name: &str, plaintext: &[u8]) -> Vec<u8> {
        let mut sealer = crate::stream::StreamSealer::new(&self.file_key(dek, file_name), self.file_stream_id(file_name));
        let mut out = Vec::with_capacity(crate::stream::sealed_len(plaintext.len() as u64) as usize);
        // Sealing fails only when the chunk counter is exhausted (2^64 chunks).
        let _ = sealer.push(plaintext, &mut out);
        let _ = sealer.finish(&mut out);
        out
    }

    /// Object key of an encrypted file stored next to the manifest at `manifest_key`.
    pub fn file_object_key(manifest_key: &str, file_name: &str) -> String {
        match manifest_key.rsplit_once('/') {
            Some((dir, _)) => format!("{dir}/{file_name}.sealed"),
            None => format!("{file_name}.sealed"),
        }
    }

    /// The STREAM id of one encrypted file.
    pub fn file_stream_id(&self, file_name: &str) -> StreamId {
        let mut hasher = Sha256::new();
        hasher.update(b"ephem-batch/v1 model stream\0");
        hasher.update(self.model_id.as_bytes());
        hasher.update([0]);
        hasher.update(self.version.to_be_bytes());
        hasher.update(file_name.as_bytes());
        let digest = hasher.finalize();
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest[..16]);
        id
    }
}

/// The optional `prompts` and `default_prompt` fields; an empty list is not a valid encoding
/// (it is written by omission), so each prompt set has one payload.
fn read_prompts(map: &mut MapReader) -> Result<Prompts, ManifestError> {
    let mut prompts = Prompts::default();
    if let Some(value) = map.optional("prompts") {
        let Value::Array(entries) = value else { return Err(CborError::WrongType("prompts").into()) };
        if entries.is_empty() || entries.len() > MAX_PROMPTS {
            return Err(ManifestError::Invalid("number of prompts"));
        }
        for entry in entries {
            let mut prompt = MapReader::new(entry)?;
            let (name, text) = (prompt.text("name")?, prompt.text("text")?);
            prompt.finish()?;
            if !valid_prompt_name(&name) || text.len() > MAX_PROMPT_BYTES {
                return Err(ManifestError::Invalid("prompt"));
            }
            if prompts.entries.last().is_some_and(|(last, _)| *last >= name) {
                return Err(ManifestError::Invalid("prompts must be sorted by name, without duplicates"));
            }
            prompts.entries.push((name, text));
        }
    }
    if let Some(value) = map.optional("default_prompt") {
        let Value::Text(name) = value else { return Err(CborError::WrongType("default_prompt").into()) };
        if prompts.get(&name).is_none() {
            return Err(ManifestError::Invalid("default_prompt names no prompt"));
        }
        prompts.default = Some(name);
    }
    Ok(prompts)
}

/// The optional `matryoshka` field: ascending, no duplicates, none zero (one payload per set).
fn read_matryoshka(map: &mut MapReader) -> Result<Vec<u32>, ManifestError> {
    let Some(value) = map.optional("matryoshka") else { return Ok(Vec::new()) };
    let Value::Array(entries) = value else { return Err(CborError::WrongType("matryoshka").into()) };
    if entries.is_empty() || entries.len() > MAX_MATRYOSHKA {
        return Err(ManifestError::Invalid("number of matryoshka dimensions"));
    }
    let mut dimensions: Vec<u32> = Vec::with_capacity(entries.len());
    for entry in entries {
        let dimension = entry
            .as_integer()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| n > 0)
            .ok_or(ManifestError::Invalid("matryoshka dimension"))?;
        if dimensions.last().is_some_and(|&last| last >= dimension) {
            return Err(ManifestError::Invalid("matryoshka dimensions must ascend, without duplicates"));
        }
        dimensions.push(dimension);
    }
    Ok(dimensions)
}

/// The optional `images`: PCR0 values (48 bytes each), ascending, without duplicates.
fn read_images(map: &mut MapReader) -> Result<Vec<[u8; 48]>, ManifestError> {
    let Some(value) = map.optional("images") else { return Ok(Vec::new()) };
    let Value::Array(entries) = value else { return Err(CborError::WrongType("images").into()) };
    if entries.is_empty() || entries.len() > MAX_IMAGES {
        return Err(ManifestError::Invalid("number of images"));
    }
    let mut images: Vec<[u8; 48]> = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Bytes(bytes) = entry else { return Err(CborError::WrongType("images").into()) };
        let pcr0: [u8; 48] = bytes.try_into().map_err(|_| ManifestError::Invalid("an image's PCR0 is not 48 bytes"))?;
        if images.last().is_some_and(|last| *last >= pcr0) {
            return Err(ManifestError::Invalid("images must ascend, without duplicates"));
        }
        images.push(pcr0);
    }
    Ok(images)
}

/// The optional `outputs`: a map from `sparse` / `multivector` to dimensions, not empty (one
/// payload per set; any other key is refused).
fn read_outputs(map: &mut MapReader) -> Result<Vec<(crate::envelope::OutputKind, u32)>, ManifestError> {
    use crate::envelope::OutputKind;
    let Some(value) = map.optional("outputs") else { return Ok(Vec::new()) };
    let mut entries = MapReader::new(value)?;
    let mut outputs = Vec::new();
    for kind in [OutputKind::MultiVector, OutputKind::Sparse] {
        if let Some(d) = entries.optional(kind.as_str()) {
            let d = cbor::as_uint(d, "outputs")?;
            outputs.push((kind, u32::try_from(d).map_err(|_| ManifestError::Invalid("outputs: dimensions"))?));
        }
    }
    entries.finish()?;
    if outputs.is_empty() {
        return Err(ManifestError::Invalid("outputs: empty (written by omission)"));
    }
    Ok(outputs)
}

/// The development model publisher: a key anyone can derive (seed SHA-256("ephem-batch
/// development model publisher")), for the embedded default only. A worker accepts it only when it
/// runs on the development NSM; production images compile their publisher's key in.
pub fn development_publisher() -> SigningKey {
    SigningKey::from_bytes(&Sha256::digest(b"ephem-batch development model publisher").into())
}

/// SHA-256 of a signed manifest's bytes: what job headers and receipts name.
pub fn manifest_hash(signed: &[u8]) -> [u8; 32] {
    Sha256::digest(signed).into()
}

/// A decoded manifest whose signature has not been checked yet.
#[derive(Debug, Clone)]
pub struct SignedManifest {
    pub publisher_kid: KeyId,
    pub manifest: Manifest,
    pub hash: [u8; 32],
    message: Sign1,
}

impl SignedManifest {
    pub fn decode(bytes: &[u8]) -> Result<Self, ManifestError> {
        let message = Sign1::decode(bytes, CONTENT_TYPE)?;
        let manifest = Manifest::from_payload(&message.payload)?;
        Ok(Self { publisher_kid: message.kid, manifest, hash: manifest_hash(bytes), message })
    }

    pub fn verify(&self, publisher: &VerifyingKey) -> Result<&Manifest, ManifestError> {
        self.message.verify(publisher)?;
        Ok(&self.manifest)
    }
}

/// Content type of a publisher-signed model minimum.
pub const MINIMUM_CONTENT_TYPE: &str = "application/vnd.ephem-batch.model-minimum.v1+cbor";

/// The publisher's floor for one model: clients refuse any manifest of `model_id` signed with
/// a lower version. Separate from the manifests because a host that withholds or deletes the
/// newest manifest would otherwise leave clients nothing to compare against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelMinimum {
    pub model_id: String,
    pub minimum_version: u64,
    pub issued_ms: u64,
}

impl ModelMinimum {
    pub fn to_payload(&self) -> Vec<u8> {
        cbor::encode(
            &MapBuilder::new()
                .uint("v", 1)
                .text("model", &self.model_id)
                .uint("minimum_version", self.minimum_version)
                .uint("issued_ms", self.issued_ms)
                .build(),
        )
    }

    pub fn from_payload(bytes: &[u8]) -> Result<Self, ManifestError> {
        let mut map = MapReader::from_bytes(bytes)?;
        if map.uint("v")? != 1 {
            return Err(ManifestError::Invalid("unknown model minimum version"));
        }
        let minimum = Self { model_id: map.text("model")?, minimum_version: map.uint("minimum_version")?, issued_ms: map.uint("issued_ms")? };
        map.finish()?;
        if !valid_model_id(&minimum.model_id) {
            return Err(ManifestError::Invalid("model id"));
        }
        Ok(minimum)
    }

    /// Signs with the model publisher key (its own content type: a manifest signature is never
    /// taken for a minimum, nor the reverse).
    pub fn sign(&self, publisher: &SigningKey) -> Vec<u8> {
        cose::sign(self.to_payload(), MINIMUM_CONTENT_TYPE, publisher)
    }
}

/// A decoded model minimum whose signature has not been checked yet.
#[derive(Debug, Clone)]
pub struct SignedModelMinimum {
    pub publisher_kid: KeyId,
    pub minimum: ModelMinimum,
    message: Sign1,
}

impl SignedModelMinimum {
    pub fn decode(bytes: &[u8]) -> Result<Self, ManifestError> {
        let message = Sign1::decode(bytes, MINIMUM_CONTENT_TYPE)?;
        let minimum = ModelMinimum::from_payload(&message.payload)?;
        Ok(Self { publisher_kid: message.kid, minimum, message })
    }

    pub fn verify(&self, publisher: &VerifyingKey) -> Result<&ModelMinimum, ManifestError> {
        self.message.verify(publisher)?;
        Ok(&self.minimum)
    }
}

#[cfg(test)]
pub(crate) mod tests;
