//! Downloading and opening a job's sealed output: the bytes are hashed as they arrive (the
//! receipt names their SHA-256), the result envelope is opened with the client's key and checked
//! to belong to the job, and the decrypted record stream is hashed too (for the plaintext
//! commitment) and decoded record by record, in constant memory.

use std::io::Read;

use anyhow::{anyhow, Context};
use cloud::{layout, Services};
use indicatif::ProgressBar;
use protocol::envelope::{self, JobId, Preamble, ResultSecretKey, StreamKind, MAX_HEADER_LEN};
use protocol::records::{OutputDecoder, OutputRecord};
use sha2::{Digest, Sha256};

use crate::jobstate::{Downloaded, IdsDigest};

/// Reads the object at `attempt`, calls `sink` with each record in order. The returned attempt
/// is the one the output's authenticated header names, not the key it was read from.
pub fn open_output(
    services: &Services,
    job: &JobId,
    attempt: u64,
    key: &ResultSecretKey,
    expected_records: Option<u64>,
    progress: Option<&ProgressBar>,
    mut sink: impl FnMut(OutputRecord) -> anyhow::Result<()>,
) -> anyhow::Result<Downloaded> {
    let object = layout::job_output(job, attempt);
    let mut reader = services.jobs.reader(&object).with_context(|| format!("downloading {object}"))?;
    let mut sealed_hash = Sha256::new();
    let mut plain_hash = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut pending = Vec::new();
    let mut opened = None;
    let mut decoder = OutputDecoder::new();
    let mut plain = Vec::new();
    let (mut ok, mut failed) = (0u64, 0u64);
    let mut ids = IdsDigest::new();
    loop {
        let n = reader.read(&mut buffer).with_context(|| format!("downloading {object}"))?;
        if let Some(bar) = progress {
            bar.inc(n as u64);
        }
        let chunk = &buffer[..n];
        sealed_hash.update(chunk);
        let body: &[u8] = if opened.is_none() {
            pending.extend_from_slice(chunk);
            match Preamble::parse(&pending, StreamKind::JobResult).context("result envelope")? {
                Some((preamble, used)) => {
                    let result = envelope::open_result(&preamble, key, Some(*job)).context("result envelope")?;
                    opened = Some(result);
                    pending.drain(..used);
                    &pending
                }
                None if n == 0 => return Err(anyhow!("result envelope: the object ends inside its preamble")),
                None if pending.len() > MAX_HEADER_LEN + 1024 => return Err(anyhow!("result envelope: preamble too long")),
                None => continue,
            }
        } else {
            chunk
        };
        let result = opened.as_mut().expect("opened above");
        plain.clear();
        if n == 0 {
            result.opener.push(body, &mut plain).context("result stream")?;
            result.opener.finish(&mut plain).context("result stream")?;
        } else {
            result.opener.push(body, &mut plain).context("result stream")?;
        }
        plain_hash.update(&plain);
        decoder.push(&plain);
        while let Some(record) = decoder.next_record().context("result records")? {
            ids.push(record.id());
            match &record {
                OutputRecord::Embedding { .. } => ok += 1,
                OutputRecord::Error { .. } => failed += 1,
            }
            sink(record)?;
        }
        if !pending.is_empty() && opened.is_some() {
            pending.clear();
        }
        if n == 0 {
            break;
        }
    }
    decoder.finish(expected_records).context("result records")?;
    let header = opened.map(|o| o.header).ok_or_else(|| anyhow!("result envelope: no preamble"))?;
    Ok(Downloaded {
        attempt: header.attempt,
        sealed_sha256: hex::encode(sealed_hash.finalize()),
        plaintext_sha256: hex::encode(plain_hash.finalize()),
        records_ok: ok,
        records_failed: failed,
        ids_sha256: Some(ids.finish()),
    })
}
