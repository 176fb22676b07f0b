//! `ledger prove-record` / `ledger verify-record` (docs/protocol.md §8.14): one record of a job
//! proven to someone who sees nothing else of it. The bundle opens one leaf of the receipt's
//! record tree (§4: the record's index, id, text, its per-record key and its output record) and
//! carries the path from that leaf to the receipt's `records` root and the job's ledger proof
//! (§8.6) — the receipt in a checkpoint signed by the ledger key (and cosigned by witnesses).
//! Of the other records it reveals only hashes.

use anyhow::bail;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use protocol::receipt::SignedReceipt;
use protocol::record_tree::{self, RecordLeaf};
use protocol::envelope::OutputKind;
use protocol::records::{OutputDecoder, OutputRecord, Vector};
use receipts_ledger::merkle::{inclusion_proof, verify_inclusion, MemoryTree};
use receipts_ledger::ProofBundle;
use serde::{Deserialize, Serialize};

use super::*;

/// The bundle's format version.
pub const RECORD_BUNDLE_VERSION: u32 = 1;

/// What `prove-record` writes.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct RecordBundle {
    pub version: u32,
    pub job_id: JobId,
    /// The record's place among the job's embedded records (its leaf index).
    pub index: u64,
    pub id: String,
    /// The input text, base64 (its bytes exactly as sealed).
    pub text: String,
    /// `record_key_i`, hex: opens this record's text commitment and no other.
    pub record_key: String,
    /// The output record as the enclave encoded it (§3), base64.
    pub output_record: String,
    /// Leaves in the record tree (the receipt's `ok`).
    pub records: u64,
    /// Inclusion path from the leaf to the receipt's `records` root, hex.
    pub path: Vec<String>,
    /// The job's ledger proof (§8.6).
    pub ledger: ProofBundle,
}

/// What a valid record bundle proves.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct ProvenRecord {
    pub id: String,
    pub index: u64,
    pub text: String,
    pub tokens: u32,
    /// The vector's length (a sparse vector's vocabulary, a multi-vector record's width, a
    /// rerank record's document count).
    pub dimensions: usize,
    #[serde(flatten)]
    pub values: ProvenValues,
    #[serde(flatten)]
    pub receipt: ProvenReceipt,
    pub witnesses: Vec<String>,
}

/// A proven record's values under the name a results line gives them (`"vector"`, `"scores"`,
/// `"sparse"`, `"vectors"`), so that a sparse record is not widened to its vocabulary.
#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum ProvenValues {
    /// A dense vector (a compact encoding's integers as numbers).
    Vector(Vec<f32>),
    /// A cross-encoder's score per document, in the record's order.
    Scores(Vec<f32>),
    /// Weights by vocabulary index, ascending.
    Sparse(std::collections::BTreeMap<u32, f32>),
    /// One vector per kept token, in the text's order.
    Vectors(Vec<Vec<f32>>),
}

impl ProvenValues {
    /// The values of `vector` as a job of output `kind` gives them; `None` when the record's form
    /// is not that kind's.
    fn of(vector: &Vector, kind: OutputKind) -> Option<Self> {
        Some(match (vector, kind) {
            (Vector::Sparse(sparse), OutputKind::Sparse) => {
                ProvenValues::Sparse(sparse.indices.iter().copied().zip(sparse.values.iter().copied()).collect())
            }
            (Vector::Multi(multi), OutputKind::MultiVector) => ProvenValues::Vectors(multi.rows().map(<[f32]>::to_vec).collect()),
            (Vector::Sparse(_) | Vector::Multi(_), _) | (_, OutputKind::Sparse | OutputKind::MultiVector) => return None,
            (_, OutputKind::Scores) => ProvenValues::Scores(vector.to_f32()),
            (_, OutputKind::Dense) => ProvenValues::Vector(vector.to_f32()),
        })
    }

    /// How `verify-record` says what was proven.
    fn describe(&self, dimensions: usize) -> String {
        match self {
            ProvenValues::Vector(_) => format!("{dimensions} dimensions"),
            ProvenValues::Scores(scores) => format!("{} scores", scores.len()),
            ProvenValues::Sparse(weights) => format!("{} weights over {dimensions} dimensions", weights.len()),
            ProvenValues::Vectors(rows) => format!("{} vectors of {dimensions} dimensions", rows.len()),
        }
    }
}

/// The record tree of a job, rebuilt by its client from its input file and its opened output.
pub struct RebuiltRecords {
    pub tree: MemoryTree,
    /// The wanted record: its index, text and encoded output record.
    pub found: Option<(u64, Vec<u8>, Vec<u8>)>,
}

/// Input records, in the order they were sealed.
pub type Inputs<'a> = Box<dyn Iterator<Item = anyhow::Result<protocol::records::InputRecord>> + 'a>;

/// Walks the job's output records in order beside its input records (a shard's input is a
/// contiguous run of the file, so inputs not in the output are skipped), computing each
/// embedded record's leaf under the job's commitment key; one output record in memory at a time.
pub struct RecordRebuilder<'a> {
    commitment_key: [u8; 32],
    inputs: Inputs<'a>,
    wanted: String,
    rebuilt: RebuiltRecords,
}

impl<'a> RecordRebuilder<'a> {
    pub fn new(commitment_key: &[u8; 32], inputs: Inputs<'a>, wanted: &str) -> Self {
        let rebuilt = RebuiltRecords { tree: MemoryTree::new(), found: None };
        Self { commitment_key: *commitment_key, inputs, wanted: wanted.to_owned(), rebuilt }
    }

    pub fn push(&mut self, output: &OutputRecord) -> anyhow::Result<()> {
        let input = loop {
            match self.inputs.next() {
                Some(record) => {
                    let record = record?;
                    if record.id == output.id() {
                        break record;
                    }
                }
                None => bail!("the input file no longer holds record {:?} of the output: it changed since it was submitted", output.id()),
            }
        };
        if !matches!(output, OutputRecord::Embedding { .. }) {
            return Ok(());
        }
        let mut encoded = Vec::new();
        protocol::records::encode_output(output, &mut encoded)?;
        let tree = &mut self.rebuilt.tree;
        let index = tree.size();
        let key = record_tree::record_key(&self.commitment_key, index);
        tree.push_leaf_hash(RecordLeaf::from_encoded(&key, index, output.id(), &input.text, &encoded).hash());
        if output.id() == self.wanted {
            self.rebuilt.found = Some((index, input.text, encoded));
        }
        Ok(())
    }

    pub fn finish(self) -> RebuiltRecords {
        self.rebuilt
    }
}

/// The bundle for record `id` of a job whose receipt (`receipt`, verified by the caller) and
/// ledger proof are given, from the rebuilt tree.
pub fn record_bundle(
    job: &JobId,
    id: &str,
    commitment_key: &[u8; 32],
    receipt: &[u8],
    ledger: ProofBundle,
    rebuilt: &RebuiltRecords,
) -> anyhow::Result<RecordBundle> {
    let signed = SignedReceipt::decode(receipt)?;
    let Some(root) = signed.receipt.records_root else {
        bail!("the receipt of job {job} commits to no record tree (its enclave predates record proofs)");
    };
    let size = rebuilt.tree.size();
    if size != signed.receipt.records_ok || receipts_ledger::merkle::root_at(&rebuilt.tree, size)? != root {
        bail!("the input file and the output do not rebuild the receipt's record tree ({size} records; the receipt says {}): the input changed since it was submitted", signed.receipt.records_ok);
    }
    let Some((index, text, encoded)) = &rebuilt.found else {
        bail!("job {job} embedded no record with id {id:?}");
    };
    let path = inclusion_proof(&rebuilt.tree, *index, size)?;
    Ok(RecordBundle {
        version: RECORD_BUNDLE_VERSION,
        job_id: *job,
        index: *index,
        id: id.to_owned(),
        text: B64.encode(text),
        record_key: hex::encode(record_tree::record_key(commitment_key, *index)),
        output_record: B64.encode(encoded),
        records: size,
        path: path.iter().map(hex::encode).collect(),
        ledger,
    })
}

/// `prove-record`'s arguments (run through `ephem-batch`: it reads the job's results).
#[derive(Args, Debug)]
pub struct ProveRecordArgs {
    /// The job (hex id).
    #[arg(value_parser = parse_job)]
    pub job: JobId,
    /// The record's id, as in the input file.
    pub id: String,
    /// Where to write the bundle (JSON).
    #[arg(short, long)]
    pub output: PathBuf,
    /// The job's input file, if not where it was submitted from (the same bytes).
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    #[command(flatten)]
    pub trust: crate::trust::TrustArgs,
}

fn refusal(check: &'static str, message: impl Into<String>) -> Refusal {
    Refusal { check, message: message.into() }
}

/// Checks a record bundle offline, in order: its form (`bundle`), the job's ledger proof and
/// receipt (the checks of `verify-bundle`, and the witness policy), the output record it opens
/// (`record`), the tree's size (`record_tree_size`) and the path to the receipt's root
/// (`record_inclusion`).
pub fn check_record_bundle(
    bytes: &[u8],
    pinned: &VerifierKey,
    check: &ReceiptVerifier,
    witnesses: Option<&receipts_ledger::WitnessPolicy>,
) -> Result<ProvenRecord, Refusal> {
    let bundle: RecordBundle = serde_json::from_slice(bytes).map_err(|e| refusal("bundle", e.to_string()))?;
    if bundle.version != RECORD_BUNDLE_VERSION {
        return Err(refusal("bundle", format!("version {} (this client reads {RECORD_BUNDLE_VERSION})", bundle.version)));
    }
    let ledger_json = bundle.ledger.to_json();
    let (receipt, witnessed) = check_bundle_witnessed(ledger_json.as_bytes(), pinned, check, Some(&bundle.job_id), witnesses)?;
    let receipt_bytes = hex::decode(&bundle.ledger.receipt).map_err(|e| refusal("bundle", e.to_string()))?;
    let signed = SignedReceipt::decode(&receipt_bytes).map_err(|e| refusal("receipt", e.to_string()))?;
    let root = signed.receipt.records_root.ok_or_else(|| refusal("record_tree", "the receipt commits to no record tree"))?;

    let decode = |field: &str, text: &str| B64.decode(text).map_err(|e| refusal("bundle", format!("{field}: {e}")));
    let (text, encoded) = (decode("text", &bundle.text)?, decode("output_record", &bundle.output_record)?);
    let mut decoder = OutputDecoder::new();
    decoder.push(&encoded);
    let output = match (decoder.next_record(), decoder.next_record()) {
        (Ok(Some(record)), Ok(None)) => record,
        _ => return Err(refusal("record", "output_record is not exactly one output record")),
    };
    let OutputRecord::Embedding { id, tokens, vector } = &output else {
        return Err(refusal("record", "the output record is an error, not an embedding"));
    };
    if *id != bundle.id {
        return Err(refusal("record", format!("the output record is of id {id:?}, the bundle names {:?}", bundle.id)));
    }
    let kind = signed.receipt.options.output;
    let values = ProvenValues::of(vector, kind).ok_or_else(|| {
        let held = match vector {
            Vector::Sparse(_) => "sparse weights",
            Vector::Multi(_) => "token vectors",
            _ => "one vector",
        };
        refusal("record", format!("the receipt's output is {}, the record holds {held}", kind.as_str()))
    })?;
    let dimensions = match vector {
        Vector::Sparse(sparse) => sparse.dimensions as usize,
        Vector::Multi(multi) => usize::from(multi.dimensions),
        _ => vector.len(),
    };
    if bundle.records != signed.receipt.records_ok {
        return Err(refusal("record_tree_size", format!("{} records, the receipt embedded {}", bundle.records, signed.receipt.records_ok)));
    }
    let key: [u8; 32] = hex::decode(&bundle.record_key).ok().and_then(|k| k.try_into().ok())
        .ok_or_else(|| refusal("bundle", "record_key is not 32 bytes of hex"))?;
    let path = bundle.path.iter()
        .map(|h| hex::decode(h).ok().and_then(|b| <[u8; 32]>::try_from(b).ok()))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| refusal("bundle", "a path hash is not 32 bytes of hex"))?;
    let leaf = RecordLeaf::from_encoded(&key, bundle.index, id, &text, &encoded);
    verify_inclusion(bundle.index, bundle.records, &leaf.hash(), &path, &root)
        .map_err(|e| refusal("record_inclusion", format!("record {} of {}: {e}", bundle.index, bundle.records)))?;
    Ok(ProvenRecord {
        id: id.clone(),
        index: bundle.index,
        text: String::from_utf8_lossy(&text).into_owned(),
        tokens: *tokens,
        dimensions,
        values,
        receipt,
        witnesses: witnessed,
    })
}

#[derive(Serialize)]
struct RecordJson {
    valid: bool,
    error: Option<Refusal>,
    proven: Option<ProvenRecord>,
}

pub(super) fn verify_record_command(
    dir: &Path,
    path: &Path,
    ledger_key: &str,
    root: &RootArgs,
    witness: &WitnessArgs,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let (bytes, trust) = super::verify_bundle::OfflineCheck::load(dir, path, ledger_key, root, witness)?;
    let outcome = check_record_bundle(&bytes, &trust.pinned.key, &trust.check, trust.witnesses.as_ref());
    if json {
        let (proven, error) = match &outcome {
            Ok(p) => (Some(p.clone()), None),
            Err(e) => (None, Some(e.clone())),
        };
        println!("{}", serde_json::to_string_pretty(&RecordJson { valid: outcome.is_ok(), error, proven })?);
    } else {
        match &outcome {
            Ok(p) => {
                println!("record {:?} (#{} of job {}) is proven: {}, {} tokens", p.id, p.index, p.receipt.fields.job_id, p.values.describe(p.dimensions), p.tokens);
                println!("  model {}, PCR0 {}…", p.receipt.fields.model_id, &p.receipt.fields.pcr0[..16.min(p.receipt.fields.pcr0.len())]);
                println!("  receipt at entry {} of checkpoint {} signed by {}", p.receipt.leaf_index, p.receipt.tree_size, p.receipt.ledger_key);
                for w in &p.witnesses {
                    println!("  cosigned by {w}");
                }
            }
            Err(e) => println!("INVALID: {}: {}", e.check, e.message),
        }
    }
    Ok(if outcome.is_ok() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
