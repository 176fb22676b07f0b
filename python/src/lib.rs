//! `ephem_batch._native`: the client library behind the Python SDK, composed the way the
//! `ephem-batch` binary composes it (ephem-batch/src/main.rs): the same configuration (clap, with
//! the same `EPHEM_*` variables), the embedded default's upload wiring installed once per
//! process, and the client library's own functions for every step and every check. Nothing here
//! checks anything itself: results are refused, and verifications fail, where the client library
//! says so. The Python package (`ephem_batch`) wraps this module in its documented API.
//!
//! Values cross as JSON text (the library's own `Serialize` views); errors cross as the
//! exceptions of `ephem_batch.errors`, with the failed check as an attribute. The GIL is released
//! around every call into the library (network, sealing, opening, waiting).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use clap::Parser;
use ephem_batch_client::backend::{self, BackendArgs, Opened};
use ephem_batch_client::home::Home;
use ephem_batch_client::jobstate::JobFiles;
use ephem_batch_client::ledger::{LedgerTrust, RootArgs};
use ephem_batch_client::results::{self, ResultsError};
use ephem_batch_client::submit::{self, PrecisionArg, SubmitArgs};
use ephem_batch_client::trust::{ClientTrust, TrustArgs};
use ephem_batch_client::{keys, serve, status, verify, wait};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The client's configuration: the `ephem-batch` binary's global options and trust options,
/// read from the same flags and `EPHEM_*` variables.
#[derive(Parser, Debug)]
#[command(name = "ephem_batch.Client", no_binary_name = true, disable_help_flag = true, disable_version_flag = true)]
struct Config {
    /// State directory of the embedded default and of this client's keys and jobs.
    #[arg(long, env = "EPHEM_HOME", value_name = "DIR")]
    home: Option<PathBuf>,
    #[command(flatten)]
    backend: BackendArgs,
    #[command(flatten)]
    trust: TrustArgs,
}

/// `ledger query`'s options (the CLI's own parsers for ids, times and PCRs).
#[derive(Parser, Debug)]
#[command(name = "ephem_batch.Ledger.query", no_binary_name = true, disable_help_flag = true, disable_version_flag = true)]
struct QueryArgs {
    #[arg(long)]
    job: Option<String>,
    #[arg(long)]
    model: Option<String>,
    #[arg(long)]
    pcr0: Option<String>,
    #[arg(long)]
    client: Option<String>,
    #[arg(long)]
    since: Option<String>,
    #[arg(long)]
    until: Option<String>,
    /// Only usage receipts of online requests, or only jobs.
    #[arg(long, value_parser = ["job", "usage"])]
    kind: Option<String>,
    #[arg(long)]
    ledger_key: Option<String>,
    #[command(flatten)]
    root: RootArgs,
}

/// `ledger verify-bundle`'s options (the CLI's own: `EPHEM_LEDGER_KEY`, the root options).
#[derive(Parser, Debug)]
#[command(name = "ephem_batch.verify_bundle", no_binary_name = true, disable_help_flag = true, disable_version_flag = true)]
struct VerifyBundleArgs {
    #[arg(long, env = "EPHEM_LEDGER_KEY")]
    ledger_key: String,
    #[arg(long)]
    job: Option<String>,
    #[arg(long)]
    home: Option<PathBuf>,
    #[command(flatten)]
    root: RootArgs,
}

/// The backend a process opened first: the client library keeps one backend per process (its
/// fleet KMS key and ledger are process-wide), so a second, different one is refused.
static OPENED: Mutex<Option<(PathBuf, String)>> = Mutex::new(None);

/// Raises `ephem_batch.errors.<class>(message, **attributes)`.
fn raise(py: Python<'_>, class: &str, message: String, attributes: &[(&str, Py<PyAny>)]) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let class = py.import("ephem_batch.errors")?.getattr(class)?;
        let kwargs = PyDict::new(py);
        for (name, value) in attributes {
            kwargs.set_item(*name, value)?;
        }
        Ok(PyErr::from_value(class.call((message.clone(),), Some(&kwargs))?))
    };
    build().unwrap_or_else(|error| error)
}

/// The library's error as the exception that names what failed.
fn library_error(py: Python<'_>, error: anyhow::Error) -> PyErr {
    if let Some(refused) = error.downcast_ref::<ResultsError>() {
        let failed: Vec<(String, String)> = match refused {
            ResultsError::NotVerified { failed, .. } => failed.iter().map(|c| (c.name.to_owned(), c.detail.clone())).collect(),
            ResultsError::Manifest { detail } => vec![("manifest".to_owned(), detail.clone())],
        };
        let check = failed.first().map(|(name, _)| name.clone()).unwrap_or_default();
        let failed = failed.into_pyobject(py).map(|f| f.into_any().unbind()).unwrap_or_else(|_| py.None());
        return raise(py, "VerificationError", format!("{error:#}"), &[("check", check.into_pyobject(py).unwrap().into_any().unbind()), ("failed", failed)]);
    }
    if let Some(timed_out) = error.downcast_ref::<wait::WaitTimedOut>() {
        let attributes = [
            ("job_id", timed_out.job.to_hex().into_pyobject(py).unwrap().into_any().unbind()),
            ("state", timed_out.state.into_pyobject(py).unwrap().into_any().unbind()),
        ];
        return raise(py, "WaitTimeoutError", format!("{error:#}"), &attributes);
    }
    if let Some(online) = error.downcast_ref::<serve::OnlineError>() {
        let attributes = [
            ("check", online.code.clone().into_pyobject(py).unwrap().into_any().unbind()),
            ("status", online.status.into_pyobject(py).unwrap().into_any().unbind()),
        ];
        return raise(py, "OnlineError", format!("{error:#}"), &attributes);
    }
    raise(py, "EphemBatchError", format!("{error:#}"), &[])
}

fn config_error(py: Python<'_>, error: impl std::fmt::Display) -> PyErr {
    raise(py, "ConfigurationError", error.to_string(), &[])
}

fn to_json<T: serde::Serialize>(py: Python<'_>, value: &T) -> PyResult<String> {
    serde_json::to_string(value).map_err(|e| raise(py, "EphemBatchError", format!("encoding a result: {e}"), &[]))
}

/// One configured client: a home, an opened backend, the trust options.
#[pyclass(frozen, module = "ephem_batch._native")]
struct NativeClient {
    home: Home,
    opened: Opened,
    trust: TrustArgs,
    backend: String,
    /// The online path, made at the first `embed` (per relay): its verified document and pinned
    /// manifests serve later calls until they are due for a refresh.
    online: Mutex<Option<(Option<String>, Arc<serve::OnlineClient>)>>,
}

#[pymethods]
impl NativeClient {
    /// `args`: the `ephem-batch` global and trust options, as on its command line.
    #[new]
    fn new(py: Python<'_>, args: Vec<String>) -> PyResult<Self> {
        let config = Config::try_parse_from(&args).map_err(|e| config_error(py, e.to_string().trim_end()))?;
        let home = Home::resolve(config.home.as_deref()).map_err(|e| library_error(py, e))?;
        let backend = format!("{:?}", config.backend.backend).to_lowercase();
        {
            let mut opened = OPENED.lock().expect("not poisoned");
            let this = (home.root().to_path_buf(), backend.clone());
            match opened.as_ref() {
                Some(first) if *first != this => {
                    return Err(config_error(
                        py,
                        format!(
                            "this process already opened the {} backend with home {}: one backend per process (its fleet key and ledger are process-wide), so {} with home {} is refused",
                            first.1,
                            first.0.display(),
                            this.1,
                            this.0.display()
                        ),
                    ));
                }
                _ => *opened = Some(this),
            }
        }
        let backend_args = config.backend.clone();
        let opened = py.detach(|| backend::open(&home, &backend_args)).map_err(|e| library_error(py, e))?;
        Ok(NativeClient { home, opened, trust: config.trust, backend, online: Mutex::new(None) })
    }

    /// Embeds `texts` through the online path (`serve::OnlineClient`, made once per client: the
    /// fleet document verified, the model's manifest pinned, Oblivious HTTP through the relay);
    /// the vectors, row by row.
    #[pyo3(signature = (model, texts, relay=None, dimensions=None, prompt_name=None))]
    fn embed(
        &self,
        py: Python<'_>,
        model: &str,
        texts: Vec<String>,
        relay: Option<String>,
        dimensions: Option<u32>,
        prompt_name: Option<String>,
    ) -> PyResult<Vec<Vec<f32>>> {
        let shape = serve::OnlineShape { dimensions, prompt_name };
        py.detach(|| self.online_client(relay).and_then(|client| client.embed(model, &texts, &shape))).map_err(|e| library_error(py, e))
    }

    /// Scores `documents` against `query` with a cross-encoder through the online path (`POST
    /// /v1/rerank` inside Oblivious HTTP): `(index, relevance score)`, best first.
    #[pyo3(signature = (model, query, documents, top_n=None, relay=None))]
    fn rerank(
        &self,
        py: Python<'_>,
        model: &str,
        query: &str,
        documents: Vec<String>,
        top_n: Option<usize>,
        relay: Option<String>,
    ) -> PyResult<Vec<(usize, f32)>> {
        py.detach(|| self.online_client(relay).and_then(|client| client.rerank(model, query, &documents, top_n))).map_err(|e| library_error(py, e))
    }

    #[getter]
    fn home(&self) -> String {
        self.home.root().display().to_string()
    }

    #[getter]
    fn backend(&self) -> String {
        self.backend.clone()
    }

    /// Seals `file` (JSON lines or OpenAI Batch) and submits it as one job; the job's record
    /// (`jobstate::ClientJob`) as JSON.
    #[pyo3(signature = (file, model, *, model_version=None, manifest_sha256=None, precision="fp32", f16=false, truncate=true, normalize=true, prompt=None, dimensions=None))]
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        py: Python<'_>,
        file: PathBuf,
        model: String,
        model_version: Option<u64>,
        manifest_sha256: Option<String>,
        precision: &str,
        f16: bool,
        truncate: bool,
        normalize: bool,
        prompt: Option<String>,
        dimensions: Option<u32>,
    ) -> PyResult<String> {
        let precision = match precision {
            "fp32" => PrecisionArg::Fp32,
            "bf16" => PrecisionArg::Bf16,
            "int8" => PrecisionArg::Int8,
            other => return Err(config_error(py, format!("precision {other:?}: expected \"fp32\", \"bf16\" or \"int8\""))),
        };
        let args = SubmitArgs {
            file,
            model,
            model_version,
            manifest_sha256,
            wait: false,
            wait_timeout: None,
            output: None,
            format: None,
            f16,
            // The compact encodings are the command line's for now (docs/python.md).
            dtype: None,
            ranges: None,
            output_kind: None,
            top_k: None,
            max_record_bytes: None,
            no_truncate: !truncate,
            no_normalize: !normalize,
            precision,
            prompt,
            dimensions,
            json: true,
            bulk: false,
            shard_records: submit::DEFAULT_SHARD_RECORDS,
            store: submit::DEFAULT_STORE.to_owned(),
            partial: false,
            trust: self.trust.clone(),
        };
        // The file's own checks first, before anything reaches the stack: a ValueError naming it.
        py.detach(|| submit::check_input(&args)).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
        let job = py.detach(|| submit::run(&self.home, &self.opened.services, &args)).map_err(|e| library_error(py, e))?;
        to_json(py, &job)
    }

    /// What this client remembers of a job it submitted (`jobstate::ClientJob`) as JSON.
    fn job_record(&self, py: Python<'_>, job: &str) -> PyResult<String> {
        let id = status::parse_job(job).map_err(|e| library_error(py, e))?;
        let record = JobFiles::new(&self.home, &id.to_hex()).load().map_err(|e| library_error(py, e))?;
        to_json(py, &record)
    }

    /// Where a job stands (`status::JobView`) as JSON.
    fn status(&self, py: Python<'_>, job: &str) -> PyResult<String> {
        let id = status::parse_job(job).map_err(|e| library_error(py, e))?;
        let view = py.detach(|| status::view(&self.opened.services, &id)).map_err(|e| library_error(py, e))?;
        to_json(py, &view)
    }

    /// Follows a job until its receipt is committed and the ledger holds it (`submit --wait`'s
    /// wait); a failed job raises `JobFailedError` naming the check it failed.
    #[pyo3(signature = (job, records, timeout_s))]
    fn wait(&self, py: Python<'_>, job: &str, records: u64, timeout_s: f64) -> PyResult<()> {
        let id = status::parse_job(job).map_err(|e| library_error(py, e))?;
        let timeout = std::time::Duration::from_secs_f64(timeout_s.max(0.0));
        let services = &self.opened.services;
        match py.detach(|| wait::until_done(services, &id, records, timeout)) {
            Ok(()) => Ok(()),
            Err(error) => {
                let failure = py.detach(|| status::view(services, &id)).ok().and_then(|v| v.status).and_then(|s| s.failure);
                match failure {
                    Some(failure) if error.downcast_ref::<wait::WaitTimedOut>().is_none() => {
                        let attributes = [
                            ("job_id", id.to_hex().into_pyobject(py)?.into_any().unbind()),
                            ("check", failure.check.into_pyobject(py)?.into_any().unbind()),
                        ];
                        Err(raise(py, "JobFailedError", format!("{error:#}"), &attributes))
                    }
                    _ => Err(library_error(py, error)),
                }
            }
        }
    }

    /// Downloads, opens and checks a job's results (`ephem-batch results JOB -o OUTPUT --format
    /// npy|jsonl`): a float32 `.npy` matrix at `output` and its ids beside it, or `{"id",
    /// "embedding", "tokens"}` lines; the errors file beside it. Nothing is written if any check
    /// fails. JSON: the summary, the paths, the verification.
    #[pyo3(signature = (job, output, format="npy"))]
    fn results(&self, py: Python<'_>, job: &str, output: PathBuf, format: &str) -> PyResult<String> {
        let format = match format {
            "npy" => results::Format::Npy,
            "jsonl" => results::Format::Jsonl,
            other => return Err(config_error(py, format!("format {other:?}: expected \"npy\" or \"jsonl\""))),
        };
        let id = status::parse_job(job).map_err(|e| library_error(py, e))?;
        let written = py
            .detach(|| -> anyhow::Result<results::Written> {
                let trust = ClientTrust::load(&self.home, &self.trust)?;
                trust.warn_if_development();
                let key = keys::load_result_key(&self.home.result_key(), false)?;
                results::run(&self.home, &self.opened.services, &trust, &key, &id, Some(&output), Some(format))
            })
            .map_err(|e| library_error(py, e))?;
        let ids = matches!(format, results::Format::Npy).then(|| ids_path(&written.output));
        let value = serde_json::json!({
            "summary": written.summary,
            "output": written.output,
            "ids": ids,
            "errors": written.errors,
            "verification": written.verification,
        });
        to_json(py, &value)
    }

    /// Every check of the job's receipt (`ephem-batch verify JOB`), as JSON; the caller decides
    /// what a failed check raises.
    fn verify(&self, py: Python<'_>, job: &str) -> PyResult<String> {
        let id = status::parse_job(job).map_err(|e| library_error(py, e))?;
        let outcome = py
            .detach(|| -> anyhow::Result<verify::Verification> {
                let trust = ClientTrust::load(&self.home, &self.trust)?;
                trust.warn_if_development();
                let key = keys::load_result_key(&self.home.result_key(), false)?;
                verify::verify_job(&self.home, &self.opened.services, &trust, &id, &key, None)
            })
            .map_err(|e| library_error(py, e))?;
        to_json(py, &outcome)
    }

    /// Cancels a job no host has started (signed with this home's result key).
    fn cancel(&self, py: Python<'_>, job: &str) -> PyResult<()> {
        let id = status::parse_job(job).map_err(|e| library_error(py, e))?;
        py.detach(|| -> anyhow::Result<()> {
            let key = keys::load_result_key(&self.home.result_key(), false)?;
            status::cancel(&self.opened.services, &id, &key)
        })
        .map_err(|e| library_error(py, e))
    }

    /// `ephem-batch ledger query --json` with `args` (its options, as on its command line), on
    /// the ledger this client's backend reads.
    fn ledger_query(&self, py: Python<'_>, args: Vec<String>) -> PyResult<String> {
        let parsed = QueryArgs::try_parse_from(&args).map_err(|e| config_error(py, e.to_string().trim_end()))?;
        let job = parsed.job.as_deref().map(status::parse_job).transpose().map_err(|e| library_error(py, e))?;
        let since = parsed.since.as_deref().map(|t| parse_time(py, t)).transpose()?;
        let until = parsed.until.as_deref().map(|t| parse_time(py, t)).transpose()?;
        let kind = parsed.kind.as_deref().and_then(ephem_batch_client::ledger::EntryKind::parse);
        let filter = ephem_batch_client::ledger::query_filter(job, parsed.model, parsed.pcr0, parsed.client, since, until, kind);
        let trust = LedgerTrust { ledger_key: parsed.ledger_key, root: parsed.root };
        let dir = self.ledger_dir();
        let rows = py.detach(|| ephem_batch_client::ledger::query_ledger(&dir, &filter, &trust)).map_err(|e| library_error(py, e))?;
        to_json(py, &rows)
    }

    /// `ephem-batch ledger reconcile-usage --json` with `args` (`--ledger-key`, the root
    /// options): this home's online usage log against the ledger's usage receipts.
    fn ledger_reconcile_usage(&self, py: Python<'_>, args: Vec<String>) -> PyResult<String> {
        let parsed = QueryArgs::try_parse_from(&args).map_err(|e| config_error(py, e.to_string().trim_end()))?;
        let trust = LedgerTrust { ledger_key: parsed.ledger_key, root: parsed.root };
        let dir = self.ledger_dir();
        let found = py
            .detach(|| ephem_batch_client::usage_log::reconcile_home(&self.home, &dir, &trust))
            .map_err(|e| library_error(py, e))?;
        to_json(py, &found)
    }

    /// `ephem-batch ledger prove JOB -o OUTPUT`: the job's offline proof bundle (a checkpoint
    /// signed first if none covers its entry), checked under the ledger's own key before it is
    /// written. JSON: the path and the ledger key that verifies it.
    fn ledger_prove(&self, py: Python<'_>, job: &str, output: PathBuf) -> PyResult<String> {
        let id = status::parse_job(job).map_err(|e| library_error(py, e))?;
        let dir = self.ledger_dir();
        let key = py
            .detach(|| -> anyhow::Result<Option<String>> {
                let Some((bundle, key)) = ephem_batch_client::ledger::prove_job(&dir, &id)? else { return Ok(None) };
                let mut text = bundle.to_json();
                text.push('\n');
                write_private(&output, text.as_bytes())?;
                Ok(Some(key.to_string()))
            })
            .map_err(|e| library_error(py, e))?;
        match key {
            Some(key) => to_json(py, &serde_json::json!({ "path": output, "ledger_key": key })),
            None => Err(raise(py, "EphemBatchError", format!("job {id} is not in the ledger (yet): wait() for it first"), &[])),
        }
    }

    /// `ephem-batch ledger prove-record JOB ID -o OUTPUT [--input FILE]`: the proof that record
    /// `id` came out of the job, revealing only that record. JSON: the path, the record's index
    /// and the tree's size.
    #[pyo3(signature = (job, id, output, input=None))]
    fn ledger_prove_record(&self, py: Python<'_>, job: &str, id: &str, output: PathBuf, input: Option<PathBuf>) -> PyResult<String> {
        let job = status::parse_job(job).map_err(|e| library_error(py, e))?;
        let bundle = py
            .detach(|| -> anyhow::Result<ephem_batch_client::ledger::RecordBundle> {
                let trust = ClientTrust::load(&self.home, &self.trust)?;
                let key = keys::load_result_key(&self.home.result_key(), false)?;
                let bundle = ephem_batch_client::record_proof::prove_record(&self.home, &self.opened.services, &trust, &key, &job, id, input.as_deref())?;
                write_private(&output, &serde_json::to_vec_pretty(&bundle)?)?;
                Ok(bundle)
            })
            .map_err(|e| library_error(py, e))?;
        to_json(py, &serde_json::json!({ "path": output, "index": bundle.index, "records": bundle.records }))
    }

    /// The ledger directory this client's backend reads (`ephem-batch ledger …`'s).
    fn ledger_dir(&self) -> PathBuf {
        let args = BackendArgs { backend: if self.backend == "aws" { backend::Backend::Aws } else { backend::Backend::Local }, ..BackendArgs::default() };
        backend::ledger_dir(&self.home, &args)
    }
}

/// The ids file the npy writer puts beside `output` (`<stem>.ids.jsonl`).
impl NativeClient {
    /// The online client for `relay`, made once (again only if another relay is named).
    fn online_client(&self, relay: Option<String>) -> anyhow::Result<Arc<serve::OnlineClient>> {
        let mut online = self.online.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, client)) = online.as_ref().filter(|(made_for, _)| *made_for == relay) {
            return Ok(Arc::clone(client));
        }
        let args = serve::ServeArgs { listen: ([127, 0, 0, 1], 0).into(), relay: relay.clone(), refresh_seconds: 60, require_token: false, trust: self.trust.clone() };
        let client = Arc::new(serve::OnlineClient::new(&self.home, self.opened.services.clone(), &args)?);
        *online = Some((relay, Arc::clone(&client)));
        Ok(client)
    }
}

fn ids_path(output: &Path) -> PathBuf {
    let stem = output.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    output.with_file_name(format!("{stem}.ids.jsonl"))
}

/// A time as `ledger query` takes it: Unix milliseconds, RFC 3339 or YYYY-MM-DD (UTC).
fn parse_time(py: Python<'_>, text: &str) -> PyResult<u64> {
    #[derive(Parser)]
    #[command(no_binary_name = true)]
    struct Time {
        #[command(subcommand)]
        command: ephem_batch_client::ledger::LedgerCommand,
    }
    // The CLI's own parser, through its own option.
    let parsed = Time::try_parse_from(["query", "--since", text]).map_err(|e| config_error(py, e.to_string().trim_end()))?;
    match parsed.command {
        ephem_batch_client::ledger::LedgerCommand::Query { since: Some(ms), .. } => Ok(ms),
        _ => Err(config_error(py, format!("{text:?} is not a time"))),
    }
}

/// `ephem-batch ledger verify-bundle BUNDLE --json` with `args` (its options, as on its command
/// line): offline, against the pinned ledger key only. JSON `{"valid", "error": {"check",
/// "message"}, "proven"}`; unusable options raise `ConfigurationError`.
#[pyfunction]
fn verify_bundle(py: Python<'_>, path: PathBuf, args: Vec<String>) -> PyResult<String> {
    let (parsed, bytes, dir) = offline_check(py, &path, &args)?;
    let job = parsed.job.as_deref().map(status::parse_job).transpose().map_err(|e| library_error(py, e))?;
    let outcome = py
        .detach(|| ephem_batch_client::ledger::verify_bundle_bytes(&dir, &bytes, &parsed.ledger_key, job.as_ref(), &parsed.root))
        .map_err(|e| config_error(py, format!("{e:#}")))?;
    verdict_json(py, outcome)
}

/// `ephem-batch ledger verify-record PATH` with `args` (`--ledger-key`, the root options),
/// offline. JSON as `verify_bundle`'s.
#[pyfunction]
fn verify_record(py: Python<'_>, path: PathBuf, args: Vec<String>) -> PyResult<String> {
    let (parsed, bytes, dir) = offline_check(py, &path, &args)?;
    let outcome = py
        .detach(|| ephem_batch_client::ledger::verify_record_bytes(&dir, &bytes, &parsed.ledger_key, &parsed.root))
        .map_err(|e| config_error(py, format!("{e:#}")))?;
    verdict_json(py, outcome)
}

/// An offline check's options, the file's bytes, and the ledger directory of the home where a
/// bare `development_root=True` finds its root (not created here).
fn offline_check(py: Python<'_>, path: &Path, args: &[String]) -> PyResult<(VerifyBundleArgs, Vec<u8>, PathBuf)> {
    let parsed = VerifyBundleArgs::try_parse_from(args).map_err(|e| config_error(py, e.to_string().trim_end()))?;
    let bytes = py
        .detach(|| std::fs::read(path))
        .map_err(|e| raise(py, "EphemBatchError", format!("reading {}: {e}", path.display()), &[]))?;
    let home = parsed.home.clone().or_else(|| std::env::var_os("EPHEM_HOME").map(PathBuf::from)).unwrap_or_else(|| PathBuf::from(".ephem"));
    Ok((parsed, bytes, home.join("ledger")))
}

fn verdict_json<T: serde::Serialize>(py: Python<'_>, outcome: Result<T, ephem_batch_client::ledger::Refusal>) -> PyResult<String> {
    let value = match outcome {
        Ok(proven) => serde_json::json!({ "valid": true, "error": null, "proven": proven }),
        Err(refusal) => serde_json::json!({ "valid": false, "error": refusal, "proven": null }),
    };
    to_json(py, &value)
}

/// Writes `bytes` to `path` through a private temporary file beside it, renamed into place.
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let name = path.file_name().ok_or_else(|| anyhow::anyhow!("{} is not a file name", path.display()))?;
    let tmp = path.with_file_name(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|e| anyhow::anyhow!("writing {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))
}

/// The version of the client library this module was built from.
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The one place the embedded default meets the client in this process, as in the binary.
    backend::install_local_wiring(devstack::upload_wiring);
    m.add_class::<NativeClient>()?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(verify_bundle, m)?)?;
    m.add_function(wrap_pyfunction!(verify_record, m)?)?;
    Ok(())
}
