//! One job on its own connection: open the sealed input as it streams in, embed its records in
//! bounded windows, seal each output record to the client's result key as it is produced, and
//! finish with the signed receipt (DESIGN.md §5 steps 5–6).
//!
//! Memory is bounded whatever the corpus size: one sealed chunk, one record window and one batch
//! of output at a time. The host learns nothing but ciphertext sizes and the receipt.

use std::io::{Read, Write};
use std::time::Instant;

use protocol::envelope::{self, JobId, Preamble, ResultHeader, ResultPublicKey, Sealed, StreamKind};
use protocol::frame::{self, FrameIoError, Message, MAX_DATA_LEN};
use protocol::FailedCheck;
use protocol::receipt::{PlaintextCommitment, Receipt};
use protocol::record_tree::{self, RecordLeaf, RecordTree};
use protocol::records::{encode_output, InputDecoder, InputRecord, OutputRecord};
use protocol::stream::{StreamOpener, StreamSealer};
use sha2::{Digest, Sha256};

use crate::inference::EmbedOptions;
use crate::model_memory::{MemoryError, Room};
use crate::worker::{LoadedModel, Worker};

/// Why a job failed; `check()` is the name reported to the host (and so to the client).
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("connection: {0}")]
    Connection(#[from] FrameIoError),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("envelope: {0}")]
    Envelope(#[from] envelope::EnvelopeError),
    #[error("stream: {0}")]
    Stream(#[from] protocol::stream::StreamError),
    #[error("records: {0}")]
    Records(#[from] protocol::records::RecordError),
    #[error("no fleet key for epoch {epoch} (key {key_id}) is loaded")]
    FleetKey { epoch: u64, key_id: String },
    #[error("model {0} is not loaded")]
    ModelMissing(String),
    #[error("model {model}: the job expects manifest {expected}, this enclave runs {loaded}")]
    ManifestMismatch { model: String, expected: String, loaded: String },
    #[error("options: {0}")]
    Options(String),
    #[error("{0}")]
    ModelOverBudget(crate::model_memory::MemoryError),
}

impl JobError {
    /// The check the `JobFailed` frame names.
    pub fn check(&self) -> FailedCheck {
        match self {
            JobError::Connection(_) => FailedCheck::Connection,
            JobError::Protocol(_) => FailedCheck::Protocol,
            JobError::Envelope(envelope::EnvelopeError::JobIdMismatch { .. }) => FailedCheck::JobId,
            JobError::Envelope(envelope::EnvelopeError::WrongRecipientKey { .. }) => FailedCheck::FleetKey,
            JobError::Envelope(envelope::EnvelopeError::HeaderAuthentication) => FailedCheck::HeaderAuthentication,
            JobError::Envelope(_) => FailedCheck::Envelope,
            JobError::Stream(_) => FailedCheck::Stream,
            JobError::Records(_) => FailedCheck::Records,
            JobError::FleetKey { .. } => FailedCheck::FleetKey,
            JobError::ModelMissing(_) => FailedCheck::Model,
            JobError::ManifestMismatch { .. } => FailedCheck::ModelManifest,
            JobError::Options(_) => FailedCheck::Options,
            JobError::ModelOverBudget(_) => FailedCheck::ModelOverBudget,
        }
    }
}

/// Sends sealed output in data frames and hashes exactly what it sends.
struct OutputSink<'c, C: Write> {
    connection: &'c mut C,
    hasher: Sha256,
    pending: Vec<u8>,
}

impl<C: Write> OutputSink<'_, C> {
    fn send(&mut self, bytes: &[u8]) -> Result<(), JobError> {
        self.pending.extend_from_slice(bytes);
        while self.pending.len() >= MAX_DATA_LEN {
            let rest = self.pending.split_off(MAX_DATA_LEN);
            let data = std::mem::replace(&mut self.pending, rest);
            self.hasher.update(&data);
            frame::write_frame(self.connection, &Message::Output { data })?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<[u8; 32], JobError> {
        if !self.pending.is_empty() {
            let data = std::mem::take(&mut self.pending);
            self.hasher.update(&data);
            frame::write_frame(self.connection, &Message::Output { data })?;
        }
        self.connection.flush().map_err(FrameIoError::from)?;
        Ok(self.hasher.finalize().into())
    }
}

/// State once the preamble has been authenticated.
struct Running {
    job_id: JobId,
    header: envelope::JobHeader,
    model: std::sync::Arc<LoadedModel>,
    options: EmbedOptions,
    opener: StreamOpener,
    commitment_key: zeroize::Zeroizing<[u8; 32]>,
    sealer: StreamSealer,
    epoch_document_sha256: [u8; 32],
    decoder: InputDecoder,
    window: Vec<InputRecord>,
    window_bytes: usize,
    commitment: PlaintextCommitment,
    /// The per-record tree over the embedded records so far (the receipt's `records`).
    records: RecordTree,
    ok: u64,
    failed: u64,
    tokens: u64,
    /// Embedded records computed at a wider precision than the job's (an int8 job's short
    /// texts; the receipt's `compute`).
    wider: u64,
}

/// Serves one job connection after its `Hello`. Failures are reported to the host as
/// `JobFailed` and returned.
pub fn serve<C: Read + Write>(worker: &Worker, connection: &mut C) -> Result<(), JobError> {
    let result = run(worker, connection);
    if let Err(error) = &result {
        tracing::warn!(check = error.check().as_str(), %error, "job failed");
        if !matches!(error, JobError::Connection(_)) {
            let _ = frame::write_frame(connection, &Message::JobFailed { check: error.check(), message: error.to_string() });
            let _ = connection.flush();
            // Read what the host is still sending, so that closing does not reset the
            // connection before the host has read the verdict (TCP discards unread data).
            while let Ok(Some(message)) = frame::read_frame(connection) {
                if message == Message::InputEnd {
                    break;
                }
            }
        }
    }
    result
}

fn run<C: Read + Write>(worker: &Worker, connection: &mut C) -> Result<(), JobError> {
    let started_ms = worker.now_ms();
    let started = Instant::now();
    let (claimed, attempt) = match frame::read_frame(connection)? {
        Some(Message::JobStart { job_id, attempt }) => (job_id, attempt),
        other => return Err(JobError::Protocol(format!("expected JobStart, got {other:?}"))),
    };

    let mut input_hasher = Sha256::new();
    let mut preamble_bytes = Vec::new();
    let mut running: Option<Running> = None;
    let mut plaintext = Vec::new();
    let mut sealed_out = Vec::new();
    let mut sink = OutputSink { connection, hasher: Sha256::new(), pending: Vec::new() };

    loop {
        let message = frame::read_frame(sink.connection)?
            .ok_or_else(|| JobError::Protocol("connection closed before InputEnd".into()))?;
        let data = match message {
            Message::Input { data } => data,
            Message::InputEnd => break,
            other => return Err(JobError::Protocol(format!("expected Input or InputEnd, got {other:?}"))),
        };
        input_hasher.update(&data);
        let body: &[u8] = match running {
            Some(_) => &data,
            None => {
                preamble_bytes.extend_from_slice(&data);
                let Some((preamble, used)) = Preamble::parse(&preamble_bytes, StreamKind::JobInput)? else {
                    continue;
                };
                let state = start(worker, &preamble, claimed, attempt, &mut sealed_out)?;
                sink.send(&sealed_out)?;
                sealed_out.clear();
                running = Some(state);
                let rest = preamble_bytes.split_off(used);
                preamble_bytes = rest;
                &preamble_bytes
            }
        };
        let state = running.as_mut().ok_or_else(|| JobError::Protocol("no job".into()))?;
        plaintext.clear();
        state.opener.push(body, &mut plaintext)?;
        absorb(state, &plaintext, &mut sealed_out, false)?;
        sink.send(&sealed_out)?;
        sealed_out.clear();
        frame::write_frame(sink.connection, &Message::Progress { records: state.ok + state.failed, tokens: state.tokens })?;
    }

    let Some(mut state) = running else {
        return Err(envelope::EnvelopeError::TruncatedPreamble.into());
    };
    plaintext.clear();
    state.opener.finish(&mut plaintext)?;
    absorb(&mut state, &plaintext, &mut sealed_out, true)?;
    state.sealer.finish(&mut sealed_out)?;
    sink.send(&sealed_out)?;
    let output_sha256 = sink.finish()?;

    let receipt = Receipt {
        job_id: state.job_id,
        input_sha256: input_hasher.finalize().into(),
        output_sha256,
        records_ok: state.ok,
        records_failed: state.failed,
        tokens: state.tokens,
        model_id: state.header.model_id.clone(),
        manifest_hash: state.model.manifest_hash,
        options: state.header.options.clone(),
        result_key_id: protocol::keys::key_id(&state.header.result_public_key),
        attempt,
        attestation_sha256: state.epoch_document_sha256,
        pcrs: worker.receipt_pcrs(),
        fleet_key_id: state.header.fleet_key_id,
        epoch: state.header.epoch,
        started_ms,
        finished_ms: worker.now_ms().max(started_ms),
        commitment: std::mem::take(&mut state.commitment).finish(&state.commitment_key),
        records_root: Some(state.records.root()),
        compute: state.model.engine.embedder().compute(state.options.precision, state.wider),
    };
    tracing::info!(
        job = %state.job_id, ok = state.ok, failed = state.failed, tokens = state.tokens,
        seconds = started.elapsed().as_secs_f64(), "job done"
    );
    frame::write_frame(connection, &Message::JobDone { receipt: receipt.sign(worker.receipt_key()) })?;
    connection.flush().map_err(FrameIoError::from)?;
    Ok(())
}

/// Authenticates the preamble and sets up the result envelope.
fn start(worker: &Worker, preamble: &Preamble, claimed: JobId, attempt: u64, out: &mut Vec<u8>) -> Result<Running, JobError> {
    let header = envelope::JobHeader::from_bytes(&preamble.header)?;
    let epoch = worker
        .epoch(header.epoch)
        .ok_or_else(|| JobError::FleetKey { epoch: header.epoch, key_id: hex::encode(header.fleet_key_id) })?;
    let opened = envelope::open_job(preamble, &epoch.secret, Some(claimed))?;
    let Some(model) = worker.model(&header.model_id) else {
        // A model this worker measured and can never hold fails the job for good, by name.
        if let Err(error @ MemoryError::OverBudget { .. }) =
            worker.check_model_room(&header.model_id, &header.manifest_hash, Room::Evict)
        {
            return Err(JobError::ModelOverBudget(error));
        }
        return Err(JobError::ModelMissing(header.model_id.clone()));
    };
    if model.manifest_hash != header.manifest_hash {
        return Err(JobError::ManifestMismatch {
            model: header.model_id.clone(),
            expected: hex::encode(header.manifest_hash),
            loaded: hex::encode(model.manifest_hash),
        });
    }
    let options = EmbedOptions::for_job(&header.options, model.engine.embedder(), &model.manifest)
        .map_err(|e| JobError::Options(e.to_string()))?;
    let client = ResultPublicKey::from_bytes(&header.result_public_key)?;
    let job_id = JobId(opened.stream_id);
    let result_header =
        ResultHeader { job_id, result_key_id: client.key_id(), attempt, created_ms: worker.now_ms() };
    let Sealed { preamble: result_preamble, sealer, .. } = envelope::seal_result(&result_header, &client)?;
    out.extend_from_slice(&result_preamble);
    let announced = opened.header.record_count;
    Ok(Running {
        job_id,
        header: opened.header,
        model,
        options,
        opener: opened.opener,
        commitment_key: opened.commitment_key,
        sealer,
        epoch_document_sha256: epoch.document_sha256,
        decoder: InputDecoder::announced(announced),
        window: Vec::new(),
        window_bytes: 0,
        commitment: PlaintextCommitment::new(),
        records: RecordTree::default(),
        ok: 0,
        failed: 0,
        tokens: 0,
        wider: 0,
    })
}

/// Feeds input plaintext; embeds every full window (and, at the end, the last one), sealing the
/// output records into `out`.
fn absorb(state: &mut Running, plaintext: &[u8], out: &mut Vec<u8>, last: bool) -> Result<(), JobError> {
    state.commitment.input(plaintext);
    state.decoder.push(plaintext);
    let settings = *state.model.engine.settings();
    while let Some(record) = state.decoder.next_record()? {
        state.window_bytes += record.text.len();
        state.window.push(record);
        if state.window.len() >= settings.window_records.max(1) || state.window_bytes >= settings.window_bytes {
            flush_window(state, out)?;
        }
    }
    if last {
        let decoder = std::mem::take(&mut state.decoder);
        decoder.finish(Some(state.header.record_count))?;
        flush_window(state, out)?;
    }
    Ok(())
}

fn flush_window(state: &mut Running, out: &mut Vec<u8>) -> Result<(), JobError> {
    if state.window.is_empty() {
        return Ok(());
    }
    let outputs = state.model.engine.embed_records(&state.window, &state.options, state.header.options.dtype);
    let mut plain = Vec::new();
    for (input, output) in state.window.iter().zip(&outputs) {
        let start = plain.len();
        encode_output(output, &mut plain)?;
        match output {
            OutputRecord::Embedding { id, tokens, .. } => {
                let key = record_tree::record_key(&state.commitment_key, state.ok);
                let leaf = RecordLeaf::from_encoded(&key, state.ok, id, &input.text, &plain[start..]);
                state.records.push(leaf.hash());
                state.ok += 1;
                state.tokens += u64::from(*tokens);
                let precision = state.options.precision;
                if state.model.engine.embedder().precision_for(precision, *tokens as usize) != precision {
                    state.wider += 1;
                }
            }
            OutputRecord::Error { .. } => state.failed += 1,
        }
    }
    state.commitment.output(&plain);
    state.sealer.push(&plain, out)?;
    state.window.clear();
    state.window_bytes = 0;
    Ok(())
}
