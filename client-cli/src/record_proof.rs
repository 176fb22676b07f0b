//! `ephem-batch ledger prove-record JOB ID` (docs/protocol.md §8.14): the job's receipt verified
//! as `results` does, its output opened and its input file read again to rebuild the record tree
//! ([`crate::ledger::RecordRebuilder`]), which must give the receipt's root, and the bundle for
//! one record written with the job's ledger proof.

use anyhow::{anyhow, bail, Context};

use protocol::envelope::JobId;
use receipts_ledger::ProofBundle;

use crate::ledger::{prove_job, record_bundle, Inputs, RecordBundle, RecordRebuilder};

/// Record `id` of `job` proven: the receipt verified as `results` does, the job's output opened
/// with `key` and its input file read again to rebuild the record tree, which must give the
/// receipt's root; the ledger proof is the job's own (`jobs/<id>/ledger-proof.json`).
pub fn prove_record(
    home: &crate::home::Home,
    services: &cloud::Services,
    trust: &crate::trust::ClientTrust,
    key: &protocol::envelope::ResultSecretKey,
    job: &JobId,
    id: &str,
    input: Option<&std::path::Path>,
) -> anyhow::Result<RecordBundle> {
    use crate::corpus::{CorpusItem, CorpusOptions, CorpusReader};
    let files = crate::jobstate::JobFiles::new(home, &job.to_hex());
    let state = files.load()?;
    let commitment_key = files.commitment_key()?;
    let mut checks = crate::verify::Verification::new(job, trust);
    let verified = match crate::verify::fetch_receipt(services, trust, job, &mut checks)? {
        crate::verify::Fetched::Verified(verified) => verified,
        _ => {
            let failed: Vec<String> = checks.failures().iter().map(|c| format!("{}: {}", c.name, c.detail)).collect();
            bail!("job {job} has no receipt that verifies: {}", failed.join("; "))
        }
    };
    let ledger_key = cloud::layout::job_ledger_proof(job);
    let ledger = match services.jobs.get_at_most(&ledger_key, receipts_ledger::bundle::MAX_BUNDLE_SIZE as u64) {
        Ok(bytes) => ProofBundle::from_json(&bytes).with_context(|| ledger_key.clone())?,
        // The embedded default's ledger is this home's: prove from it directly.
        Err(cloud::ObjectError::NotFound { .. }) if matches!(crate::backend::ledger_source(), crate::backend::LedgerSource::Home) => {
            prove_job(&home.ledger_dir(), job)?.ok_or_else(|| anyhow!("job {job} is not in the ledger yet"))?.0
        }
        Err(error) => return Err(anyhow::Error::new(error).context(format!("the job's ledger proof {ledger_key} (is the job in the ledger yet?)"))),
    };
    if hex::decode(&ledger.receipt).ok().as_deref() != Some(verified.bytes.as_slice()) {
        bail!("{ledger_key} proves another receipt than the job's");
    }

    let input_file = input.map_or_else(|| std::path::PathBuf::from(&state.input_file), std::path::Path::to_path_buf);
    let input = std::fs::File::open(&input_file).with_context(|| format!("the job's input file {} (--input names another copy)", input_file.display()))?;
    // The records as sealing read them: a cross-encoder's lines are rerank lines.
    let mut options = CorpusOptions::new(state.model_id.clone());
    options.rerank = Some(crate::results::output_kind(&state) == protocol::envelope::OutputKind::Scores);
    let mut corpus = CorpusReader::new(std::io::BufReader::new(input), options);
    let mut pending = std::collections::VecDeque::new();
    let inputs: Inputs<'_> = Box::new(std::iter::from_fn(move || loop {
        if let Some(record) = pending.pop_front() {
            return Some(Ok(record));
        }
        match corpus.next_item() {
            Ok(Some(CorpusItem::Records { records, .. })) => pending.extend(records),
            Ok(Some(CorpusItem::Error(_))) => {}
            Ok(None) => return None,
            Err(error) => return Some(Err(error.into())),
        }
    }));
    let mut rebuilder = RecordRebuilder::new(&commitment_key, inputs, id);
    crate::opening::open_output(services, job, verified.receipt.attempt, key, Some(state.records), None, |record| rebuilder.push(&record))?;
    record_bundle(job, id, &commitment_key, &verified.bytes, ledger, &rebuilder.finish())
}
