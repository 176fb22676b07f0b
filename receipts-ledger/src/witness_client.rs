//! The appender's side of C2SP tlog-witness: each new checkpoint goes to the configured
//! witnesses (`POST <prefix>/add-checkpoint`, with a consistency proof from the size each
//! witness last cosigned), and the cosignatures that verify under the configured witness
//! keys are added to the stored checkpoint as extra signature lines.
//!
//! Witnesses are configured as `EPHEM_WITNESSES="KEY@URL,KEY@URL"`: `KEY` a cosigner key
//! (`name+hex8+base64(0x04 || key)`), `URL` `http://host:port[/prefix]`. Without any, nothing
//! changes. Plain HTTP only: a witness's answer is checked by its key, not by the channel.

use std::collections::HashMap;
use std::io::Write as _;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::Duration;

use base64::{engine::general_purpose::STANDARD, Engine};

use crate::cosignature::{add_signature_lines, verify_cosignatures, CosignerKey};
use crate::merkle::Hash;
use crate::note::Note;
use crate::store::{LedgerStore, StoreError};

/// The variable naming the witnesses.
pub const WITNESSES_ENV: &str = "EPHEM_WITNESSES";
/// Largest answer read from a witness.
const MAX_ANSWER: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum WitnessClientError {
    #[error("witness entry {0:?} is not KEY@http://HOST:PORT[/PREFIX]")]
    Entry(String),
    #[error("witness key in {entry:?}: {error}")]
    Key { entry: String, error: crate::cosignature::CosignatureError },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One witness: its key and where it listens.
#[derive(Clone, Debug)]
pub struct WitnessEndpoint {
    pub key: CosignerKey,
    /// `host:port`.
    pub authority: String,
    /// The submission prefix's path, without a trailing `/` (empty for the root).
    pub prefix: String,
}

impl WitnessEndpoint {
    pub fn parse(entry: &str) -> Result<Self, WitnessClientError> {
        let bad = || WitnessClientError::Entry(entry.to_owned());
        let (key, url) = entry.trim().rsplit_once('@').ok_or_else(bad)?;
        let key = CosignerKey::parse(key).map_err(|error| WitnessClientError::Key { entry: entry.to_owned(), error })?;
        let rest = url.strip_prefix("http://").ok_or_else(bad)?;
        let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
        if authority.is_empty() || !authority.contains(':') {
            return Err(bad());
        }
        let prefix = if path.trim_end_matches('/').is_empty() { String::new() } else { format!("/{}", path.trim_end_matches('/')) };
        Ok(Self { key, authority: authority.to_owned(), prefix })
    }
}

/// Parses a comma-separated list of `KEY@URL` entries (empty entries are skipped).
pub fn parse_witnesses(list: &str) -> Result<Vec<WitnessEndpoint>, WitnessClientError> {
    list.split(',').filter(|e| !e.trim().is_empty()).map(WitnessEndpoint::parse).collect()
}

/// The `add-checkpoint` request body: old size line, proof lines, blank line, signed note.
pub fn add_checkpoint_body(old_size: u64, proof: &[Hash], signed_note: &str) -> String {
    let mut body = format!("old {old_size}\n");
    for h in proof {
        body.push_str(&STANDARD.encode(h));
        body.push('\n');
    }
    body.push('\n');
    body.push_str(signed_note);
    body
}

/// What one witness did with a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Submission {
    /// It cosigned: the verified signature line.
    Cosigned(String),
    /// It answered with a refusal (status and body).
    Refused { status: u16, body: String },
    /// It could not be asked, or answered something that is not a cosignature by its key.
    Failed(String),
}

/// What [`WitnessClient::cosign_latest`] did.
#[derive(Clone, Debug, Default)]
pub struct CosignReport {
    pub size: u64,
    /// Witness names whose cosignature the stored checkpoint now carries.
    pub cosigned: Vec<String>,
    /// Witness names that did not cosign, with why.
    pub refused: Vec<(String, String)>,
}

/// Submits checkpoints to a set of witnesses.
pub struct WitnessClient {
    endpoints: Vec<WitnessEndpoint>,
    /// The size each witness was last known to have cosigned (by key string).
    known: Mutex<HashMap<String, u64>>,
    timeout: Duration,
}

impl WitnessClient {
    pub fn new(endpoints: Vec<WitnessEndpoint>) -> Self {
        Self { endpoints, known: Mutex::new(HashMap::new()), timeout: Duration::from_secs(5) }
    }

    /// The witnesses of `EPHEM_WITNESSES`, or `None` when it is unset or empty.
    pub fn from_env() -> Result<Option<Self>, WitnessClientError> {
        let list = std::env::var(WITNESSES_ENV).unwrap_or_default();
        let endpoints = parse_witnesses(&list)?;
        Ok(if endpoints.is_empty() { None } else { Some(Self::new(endpoints)) })
    }

    pub fn endpoints(&self) -> &[WitnessEndpoint] {
        &self.endpoints
    }

    /// Submits `signed_note` (of tree `size`) to one witness. `prove(old, size)` gives the
    /// consistency proof from a size the witness knows; a 409 answer (the witness knows
    /// another size) is retried once from that size.
    pub fn submit(
        &self,
        endpoint: &WitnessEndpoint,
        signed_note: &str,
        size: u64,
        prove: &dyn Fn(u64, u64) -> Result<Vec<Hash>, String>,
    ) -> Submission {
        let id = endpoint.key.to_string();
        let mut old = self.known.lock().map(|k| k.get(&id).copied().unwrap_or(0)).unwrap_or(0);
        for _ in 0..2 {
            let proof = if old == 0 || old >= size {
                Vec::new()
            } else {
                match prove(old, size) {
                    Ok(p) => p,
                    Err(e) => return Submission::Failed(format!("consistency proof {old} -> {size}: {e}")),
                }
            };
            let (status, body) = match post(endpoint, &add_checkpoint_body(old, &proof, signed_note), self.timeout) {
                Ok(answer) => answer,
                Err(e) => return Submission::Failed(e),
            };
            match status {
                200 => return self.accept(endpoint, signed_note, size, &body),
                409 => match body.trim_end_matches('\n').parse::<u64>() {
                    Ok(known) if known != old => {
                        if let Ok(mut k) = self.known.lock() {
                            k.insert(id.clone(), known);
                        }
                        old = known;
                    }
                    _ => return Submission::Refused { status, body },
                },
                _ => return Submission::Refused { status, body },
            }
        }
        Submission::Refused { status: 409, body: format!("{old}\n") }
    }

    fn accept(&self, endpoint: &WitnessEndpoint, signed_note: &str, size: u64, body: &str) -> Submission {
        let Ok(with) = add_signature_lines(signed_note, body) else {
            return Submission::Failed("the answer is not signature lines".into());
        };
        let Ok(note) = Note::parse(with.as_bytes()) else { return Submission::Failed("unparsable note".into()) };
        match verify_cosignatures(&note, std::slice::from_ref(&endpoint.key)) {
            Ok(found) if !found.is_empty() => {}
            Ok(_) => return Submission::Failed("the answer holds no cosignature by the witness's key".into()),
            Err(e) => return Submission::Failed(e.to_string()),
        }
        if let Ok(mut k) = self.known.lock() {
            k.insert(endpoint.key.to_string(), size);
        }
        let line = body.lines().find(|l| l.starts_with(&format!("\u{2014} {} ", endpoint.key.name()))).unwrap_or_default();
        Submission::Cosigned(format!("{line}\n"))
    }

    /// Submits the store's latest checkpoint to every witness that has not cosigned it yet and
    /// stores the cosignatures that verify on it.
    pub fn cosign_latest(&self, store: &dyn LedgerStore) -> Result<CosignReport, WitnessClientError> {
        let Some(latest) = store.latest_checkpoint()? else { return Ok(CosignReport::default()) };
        let mut report = CosignReport { size: latest.size, ..CosignReport::default() };
        let note = Note::parse(latest.note.as_bytes()).map_err(|e| StoreError::Checkpoint(e.into()))?;
        let keys: Vec<CosignerKey> = self.endpoints.iter().map(|e| e.key.clone()).collect();
        let already: Vec<CosignerKey> = verify_cosignatures(&note, &keys).unwrap_or_default().into_iter().map(|(k, _)| k).collect();
        let prove = |old: u64, new: u64| crate::merkle::consistency_proof(store, old, new).map_err(|e| e.to_string());
        let mut lines = String::new();
        for endpoint in &self.endpoints {
            let name = endpoint.key.name().to_owned();
            if already.contains(&endpoint.key) {
                report.cosigned.push(name);
                continue;
            }
            match self.submit(endpoint, &latest.note, latest.size, &prove) {
                Submission::Cosigned(line) => {
                    lines.push_str(&line);
                    report.cosigned.push(name);
                }
                Submission::Refused { status, body } => {
                    tracing::warn!(witness = %name, status, body = %body.trim_end(), size = latest.size, "witness refused the checkpoint");
                    report.refused.push((name, format!("{status} {}", body.trim_end())));
                }
                Submission::Failed(why) => {
                    tracing::warn!(witness = %name, %why, size = latest.size, "witness did not cosign");
                    report.refused.push((name, why));
                }
            }
        }
        if !lines.is_empty() {
            let cosigned = add_signature_lines(&latest.note, &lines).map_err(|e| StoreError::Checkpoint(e.into()))?;
            store.add_cosignatures(latest.size, &cosigned)?;
        }
        Ok(report)
    }
}

/// One HTTP/1.1 POST, one answer (with a Content-Length), connection closed.
fn post(endpoint: &WitnessEndpoint, body: &str, timeout: Duration) -> Result<(u16, String), String> {
    let addr = endpoint
        .authority
        .to_socket_addrs()
        .map_err(|e| format!("{}: {e}", endpoint.authority))?
        .next()
        .ok_or_else(|| format!("{}: no address", endpoint.authority))?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("{}: {e}", endpoint.authority))?;
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    let head = format!(
        "POST {}/add-checkpoint HTTP/1.1\r\nHost: {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        endpoint.prefix,
        endpoint.authority,
        body.len()
    );
    stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes())).map_err(|e| e.to_string())?;
    let answer = protocol::kms_api::read_http_message(&mut stream, false, MAX_ANSWER).map_err(|e| e.to_string())?;
    let protocol::kms_api::StartLine::Response { status } = answer.start else { return Err("not a response".into()) };
    Ok((status, String::from_utf8_lossy(&answer.body).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_strictly() {
        let key = crate::cosignature::CosignerSigner::from_seed("w.example", &[1; 32]).unwrap().verifier();
        let list = format!("{key}@http://127.0.0.1:7001, {key}@http://localhost:7002/witness/,");
        let eps = parse_witnesses(&list).unwrap();
        assert_eq!(eps.len(), 2);
        assert_eq!((eps[0].authority.as_str(), eps[0].prefix.as_str()), ("127.0.0.1:7001", ""));
        assert_eq!((eps[1].authority.as_str(), eps[1].prefix.as_str()), ("localhost:7002", "/witness"));
        for bad in [format!("{key}"), format!("{key}@https://h:1"), format!("{key}@http://h"), "x@http://h:1".to_owned()] {
            assert!(WitnessEndpoint::parse(&bad).is_err(), "{bad}");
        }
        assert!(parse_witnesses(" ").unwrap().is_empty());
        assert_eq!(add_checkpoint_body(3, &[[0; 32]], "n\n"), "old 3\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n\nn\n");
    }
}
