//! Host ↔ enclave frames (DESIGN.md §6): `length (u32 BE) ‖ CBOR {"v": 1, "m": message}`, where
//! the message is a map with one key naming its type. A frame is at most [`MAX_FRAME_LEN`] bytes;
//! anything large (sealed jobs, results, model files) travels as a sequence of data frames of at
//! most [`MAX_DATA_LEN`] bytes.
//!
//! The enclave trusts nothing a frame says: every byte that matters is authenticated by an
//! envelope, a manifest or an attestation document, checked after the frame is decoded.

use serde::{Deserialize, Serialize};

use crate::{FailedCheck, JobId};

pub const VERSION: u8 = 1;
/// Largest frame body accepted.
pub const MAX_FRAME_LEN: usize = 1024 * 1024;
/// Largest data payload in one frame.
pub const MAX_DATA_LEN: usize = 256 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {0} bytes exceeds the {MAX_FRAME_LEN}-byte maximum")]
    TooLarge(usize),
    #[error("empty frame")]
    Empty,
    #[error("frame does not decode: {0}")]
    Malformed(String),
    #[error("unsupported frame version {0}")]
    Version(u8),
    #[error("the connection ended inside a frame")]
    Truncated,
}

/// Which side speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    Host,
    Enclave,
}

/// What the connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Channel {
    /// Key release, attestation, model loading.
    Control,
    /// One job.
    Job,
    /// Online embedding requests, one at a time: Oblivious HTTP (RFC 9458) the host relays and
    /// cannot read (docs/protocol.md §9).
    Online,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// First frame on every connection, from each side.
    Hello { role: Role, channel: Channel },

    // --- control connection ------------------------------------------------------------------
    /// Enclave → host: the AWS credentials and region to call KMS with. The enclave then calls
    /// KMS itself, over TLS that ends inside the enclave, through a byte relay on the host
    /// (`vsock-proxy` in AWS): a host can withhold KMS's answer but cannot forge it.
    KmsCredentialsRequest { request: u64 },
    /// Host → enclave: the host role's (temporary) credentials. They authorise the call; they
    /// are not secret from the host and prove nothing to the enclave.
    KmsCredentials {
        request: u64,
        region: String,
        access_key_id: String,
        secret_access_key: String,
        session_token: Option<String>,
    },
    /// Host → enclave: the host has no credentials to give.
    KmsFailed { request: u64, code: String, message: String },
    /// Enclave → host: please read this object and send it as `ObjectData` frames.
    FetchObject { request: u64, key: String },
    /// Host → enclave: part of an object; `last` marks its end.
    ObjectData {
        request: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        last: bool,
    },
    /// Host → enclave: the object does not exist or could not be read.
    ObjectMissing { request: u64, message: String },
    /// Enclave → host: the document to publish (user_data binds the fleet and receipt keys).
    PublishAttestation {
        #[serde(with = "serde_bytes")]
        document: Vec<u8>,
    },
    /// Host → enclave: produce a fresh document carrying this client nonce.
    Attest {
        request: u64,
        #[serde(with = "serde_bytes")]
        nonce: Vec<u8>,
    },
    /// Enclave → host: the fresh document.
    Attested {
        request: u64,
        #[serde(with = "serde_bytes")]
        document: Vec<u8>,
    },
    /// Host → enclave: configure the fleet key of an epoch (the wrapped key's object name).
    UseFleetEpoch { epoch: u64, object_key: String },
    /// Host → enclave: create epoch `epoch` under the KMS key `kms_key`, ending at
    /// `not_after_ms` (docs/protocol.md §7.3.1). The worker checks the key, has KMS generate the
    /// pair for it, answers `FleetEpochCreated` and then `Status`; it holds the new key only once
    /// the host asks it to use the epoch as stored.
    CreateFleetEpoch { epoch: u64, not_after_ms: u64, kms_key: String },
    /// Enclave → host: the new epoch's record and genesis (JSON each), to store create-only.
    FleetEpochCreated {
        #[serde(with = "serde_bytes")]
        record: Vec<u8>,
        #[serde(with = "serde_bytes")]
        genesis: Vec<u8>,
    },
    /// Host → enclave: load a model from its signed manifest's object name.
    LoadModel { manifest_key: String },
    /// Host → enclave: send the usage receipts of the periods that have ended, or of every
    /// period if `flush` (each as a `UsageReceipt` frame), then `Status`.
    CollectUsage { flush: bool },
    /// Enclave → host: state of the worker.
    Status { ready: bool, epochs: Vec<u64>, models: Vec<String>, detail: String },
    /// Host → enclave: load a model as `LoadModel` does, but only if it fits the worker's model
    /// memory budget beside the models it holds: instead of evicting any, the worker answers
    /// `ModelWouldEvict` (the host's periodic pass, which must not evict what jobs use).
    LoadModelIfFits { manifest_key: String },
    /// Enclave → host, in answer to `LoadModelIfFits` instead of `Status`: the model needs
    /// `bytes`, and only `free` of the budget are free without evicting another model.
    ModelWouldEvict { model_id: String, bytes: u64, free: u64 },
    /// Enclave → host, before the `Status` that ends a load: a model evicted (least recently
    /// used first) to make room for the loaded one.
    ModelEvicted {
        model_id: String,
        #[serde(with = "serde_bytes")]
        manifest_hash: Vec<u8>,
    },
    /// Host → enclave: which models do you hold, and under what budget? Answered by
    /// `ModelMemory`, then `Status`.
    ListModels,
    /// Enclave → host: the model memory budget and the models held.
    ModelMemory { budget: u64, models: Vec<ResidentModel> },

    // --- job connection ----------------------------------------------------------------------
    /// Host → enclave: a job follows; `job_id` is what the host claims, checked by the enclave.
    JobStart { job_id: JobId, attempt: u64 },
    /// Host → enclave: the next bytes of the sealed input.
    Input {
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Host → enclave: the sealed input is complete.
    InputEnd,
    /// Enclave → host: the next bytes of the sealed output.
    Output {
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Enclave → host: records processed so far.
    Progress { records: u64, tokens: u64 },
    /// Enclave → host: the output is complete and this is the signed receipt.
    JobDone {
        #[serde(with = "serde_bytes")]
        receipt: Vec<u8>,
    },
    /// Enclave → host: the job failed; `check` names what failed.
    JobFailed { check: FailedCheck, message: String },

    // --- online connection -------------------------------------------------------------------
    /// Host → enclave: an encapsulated request (`message/ohttp-req`, at most one frame).
    OnlineRequest {
        request: u64,
        #[serde(with = "serde_bytes")]
        encapsulated: Vec<u8>,
    },
    /// Enclave → host: part of the encapsulated response (`message/ohttp-res`); `last` ends it.
    OnlineResponse {
        request: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        last: bool,
    },
    /// Enclave → host: the request was refused before anything could be encrypted to its sender
    /// (it does not decapsulate, or it was replayed); `check` names what failed.
    OnlineRefused { request: u64, check: FailedCheck, message: String },
    /// Enclave → host, on the control connection in answer to `CollectUsage`: a signed usage
    /// receipt of online requests (docs/protocol.md §9.5), for the ledger.
    UsageReceipt {
        #[serde(with = "serde_bytes")]
        receipt: Vec<u8>,
        #[serde(with = "serde_bytes")]
        attestation_document: Vec<u8>,
    },

    // --- either ------------------------------------------------------------------------------
    /// A protocol error; the sender closes the connection after it.
    Error { message: String },
}

/// A model the worker holds (`ModelMemory`): what its engine holds now, and when a job or online
/// request last took it (the worker's clock, milliseconds since the epoch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResidentModel {
    pub model_id: String,
    #[serde(with = "serde_bytes")]
    pub manifest_hash: Vec<u8>,
    pub version: u64,
    pub bytes: u64,
    pub last_use_ms: u64,
}

#[derive(Serialize, Deserialize)]
struct Frame {
    v: u8,
    m: Message,
}

/// Encodes one frame, length prefix included.
pub fn encode(message: &Message) -> Result<Vec<u8>, FrameError> {
    let mut out = vec![0u8; 4];
    ciborium::into_writer(&Frame { v: VERSION, m: message.clone() }, &mut out)
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
    let len = out.len() - 4;
    if len > MAX_FRAME_LEN {
        return Err(FrameError::TooLarge(len));
    }
    out[..4].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(out)
}

/// Decodes one frame body (without its length prefix).
pub fn decode_body(body: &[u8]) -> Result<Message, FrameError> {
    if body.is_empty() {
        return Err(FrameError::Empty);
    }
    if body.len() > MAX_FRAME_LEN {
        return Err(FrameError::TooLarge(body.len()));
    }
    let mut reader = body;
    let frame: Frame = ciborium::de::from_reader_with_recursion_limit(&mut reader, 16)
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
    if !reader.is_empty() {
        return Err(FrameError::Malformed(format!("{} trailing bytes", reader.len())));
    }
    if frame.v != VERSION {
        return Err(FrameError::Version(frame.v));
    }
    Ok(frame.m)
}

/// Parses the length prefix; refuses an oversized frame before its body is read.
pub fn body_len(prefix: [u8; 4]) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(prefix) as usize;
    match len {
        0 => Err(FrameError::Empty),
        len if len > MAX_FRAME_LEN => Err(FrameError::TooLarge(len)),
        len => Ok(len),
    }
}

/// Splits a byte stream pushed in pieces of any size into frames.
#[derive(Default)]
pub struct FrameDecoder {
    buffer: Vec<u8>,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The next complete frame, if buffered. An error poisons the connection: close it.
    pub fn next_frame(&mut self) -> Result<Option<Message>, FrameError> {
        let Some(prefix) = self.buffer.get(..4) else { return Ok(None) };
        let len = body_len([prefix[0], prefix[1], prefix[2], prefix[3]])?;
        let Some(body) = self.buffer.get(4..4 + len) else { return Ok(None) };
        let message = decode_body(body)?;
        self.buffer.drain(..4 + len);
        Ok(Some(message))
    }

    /// Call at end of stream: fails if a partial frame is left.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buffer.is_empty() { Ok(()) } else { Err(FrameError::Truncated) }
    }
}

/// Why reading or writing a frame on a connection failed.
#[derive(Debug, thiserror::Error)]
pub enum FrameIoError {
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// Reads one frame from a blocking connection; `Ok(None)` at a clean end of stream (no byte of a
/// next frame). The length is checked before the body is read.
pub fn read_frame(reader: &mut impl std::io::Read) -> Result<Option<Message>, FrameIoError> {
    let mut prefix = [0u8; 4];
    let mut filled = 0;
    while filled < 4 {
        match reader.read(&mut prefix[filled..])? {
            0 if filled == 0 => return Ok(None),
            0 => return Err(FrameError::Truncated.into()),
            n => filled += n,
        }
    }
    let len = body_len(prefix)?;
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => FrameIoError::Frame(FrameError::Truncated),
        _ => FrameIoError::Io(e),
    })?;
    Ok(Some(decode_body(&body)?))
}

/// Writes one frame to a blocking connection (not flushed).
pub fn write_frame(writer: &mut impl std::io::Write, message: &Message) -> Result<(), FrameIoError> {
    writer.write_all(&encode(message)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frames_over_a_byte_stream() {
        let mut wire = Vec::new();
        write_frame(&mut wire, &Message::InputEnd).unwrap();
        write_frame(&mut wire, &Message::Progress { records: 3, tokens: 9 }).unwrap();
        let mut reader = wire.as_slice();
        assert_eq!(read_frame(&mut reader).unwrap(), Some(Message::InputEnd));
        assert_eq!(read_frame(&mut reader).unwrap(), Some(Message::Progress { records: 3, tokens: 9 }));
        assert_eq!(read_frame(&mut reader).unwrap(), None);
        let mut cut = &wire[..wire.len() - 1];
        read_frame(&mut cut).unwrap();
        assert!(matches!(read_frame(&mut cut), Err(FrameIoError::Frame(FrameError::Truncated))));
    }

    #[test]
    fn known_answer() {
        let bytes = encode(&Message::Input { data: vec![1, 2, 3] }).unwrap();
        // len 23 ‖ {"v": 1, "m": {"Input": {"data": h'010203'}}}
        assert_eq!(hex::encode(&bytes), "00000017a2617601616da165496e707574a1646461746143010203");
    }

    #[test]
    fn model_memory_messages_leave_the_old_encodings_as_they_were() {
        // len 33 ‖ {"v": 1, "m": {"LoadModel": {"manifest_key": "m"}}}, as before these messages.
        let old = encode(&Message::LoadModel { manifest_key: "m".into() }).unwrap();
        assert_eq!(hex::encode(&old), "00000021a2617601616da1694c6f61644d6f64656ca16c6d616e69666573745f6b6579616d");
        let messages = vec![
            Message::LoadModelIfFits { manifest_key: "models/a/v1/manifest.cose".into() },
            Message::ModelWouldEvict { model_id: "a".into(), bytes: 30 << 20, free: 1 << 20 },
            Message::ModelEvicted { model_id: "b".into(), manifest_hash: vec![0x33; 32] },
            Message::ListModels,
            Message::ModelMemory {
                budget: 64 << 20,
                models: vec![ResidentModel {
                    model_id: "a".into(),
                    manifest_hash: vec![0x44; 32],
                    version: 3,
                    bytes: 30 << 20,
                    last_use_ms: 1_790_000_000_000,
                }],
            },
        ];
        for message in messages {
            let bytes = encode(&message).unwrap();
            assert_eq!(decode_body(&bytes[4..]).unwrap(), message);
        }
    }

    #[test]
    fn a_job_start_whose_job_id_is_not_one_does_not_decode() {
        let id = JobId([0xab; 16]);
        let bytes = encode(&Message::JobStart { job_id: id, attempt: 1 }).unwrap();
        let at = bytes.windows(32).position(|w| w == id.to_hex().as_bytes()).unwrap();
        let mut upper = bytes.clone();
        upper[at..at + 32].make_ascii_uppercase();
        let mut decoder = FrameDecoder::new();
        decoder.push(&upper);
        assert!(decoder.next_frame().is_err(), "a host-chosen non-canonical job id is refused");
        decoder = FrameDecoder::new();
        decoder.push(&bytes);
        assert_eq!(decoder.next_frame().unwrap(), Some(Message::JobStart { job_id: id, attempt: 1 }));
    }

    #[test]
    fn round_trips_through_the_decoder_byte_by_byte() {
        let messages = vec![
            Message::Hello { role: Role::Host, channel: Channel::Job },
            Message::JobStart { job_id: JobId([0xab; 16]), attempt: 2 },
            Message::Input { data: vec![7; MAX_DATA_LEN] },
            Message::KmsCredentials {
                request: 9,
                region: "eu-west-1".into(),
                access_key_id: "AKIDEXAMPLE".into(),
                secret_access_key: "s".repeat(40),
                session_token: Some("t".repeat(900)),
            },
            Message::JobFailed { check: FailedCheck::Envelope, message: "bad".into() },
        ];
        let mut stream = Vec::new();
        for m in &messages {
            stream.extend(encode(m).unwrap());
        }
        let mut decoder = FrameDecoder::new();
        let mut decoded = Vec::new();
        for chunk in stream.chunks(997) {
            decoder.push(chunk);
            while let Some(m) = decoder.next_frame().unwrap() {
                decoded.push(m);
            }
        }
        decoder.finish().unwrap();
        assert_eq!(decoded, messages);
    }

    #[test]
    fn refuses_oversize_empty_and_wrong_version() {
        let mut decoder = FrameDecoder::new();
        decoder.push(&((MAX_FRAME_LEN as u32) + 1).to_be_bytes());
        assert_eq!(decoder.next_frame(), Err(FrameError::TooLarge(MAX_FRAME_LEN + 1)));
        assert_eq!(body_len([0; 4]), Err(FrameError::Empty));
        assert!(encode(&Message::Input { data: vec![0; MAX_FRAME_LEN] }).is_err());
        let mut bytes = encode(&Message::InputEnd).unwrap();
        let v_at = bytes.iter().position(|&b| b == 0x76).unwrap() + 1;
        bytes[v_at] = 0x02;
        assert_eq!(decode_body(&bytes[4..]), Err(FrameError::Version(2)));
        let mut truncated = FrameDecoder::new();
        truncated.push(&encode(&Message::InputEnd).unwrap()[..5]);
        assert_eq!(truncated.next_frame(), Ok(None));
        assert_eq!(truncated.finish(), Err(FrameError::Truncated));
    }

    proptest! {
        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let mut decoder = FrameDecoder::new();
            decoder.push(&bytes);
            while let Ok(Some(_)) = decoder.next_frame() {}
        }
    }
}
