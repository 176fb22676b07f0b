//! The commands that chain others: `submit --wait` (seal, upload, wait, open, verify, report)
//! and `submit --bulk`. The binary's `main` only parses and dispatches.

use std::process::ExitCode;

use cloud::Services;

use crate::backend::Opened;
use crate::home::Home;
use crate::submit::SubmitArgs;
use crate::{bulk, keys, results, submit, trust, wait};

/// `submit`: the job sealed and uploaded; with `--wait`, its results opened, checked and
/// reported.
pub fn submit(home: &Home, services: &Services, args: &SubmitArgs) -> anyhow::Result<ExitCode> {
    let started = std::time::Instant::now();
    let job = submit::run(home, services, args)?;
    if !args.wait {
        if args.json {
            println!("{}", serde_json::json!({"job_id": job.job_id, "records": job.records, "local_errors": job.local_errors}));
        } else {
            println!("job {}", job.job_id);
        }
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("job {} submitted: {} records ({} refused locally)", job.job_id, job.records, job.local_errors);
    let trust = trust::ClientTrust::load(home, &args.trust)?;
    let id = job.job_id;
    let timeout = args.wait_timeout.map_or(wait::DEFAULT_WAIT_TIMEOUT, std::time::Duration::from_secs);
    wait::until_done(services, &id, job.records, timeout)?;
    let key = keys::load_result_key(&home.result_key(), false)?;
    let written = results::run(home, services, &trust, &key, &id, args.output.as_deref(), args.format)?;
    report_written(&job.job_id.to_hex(), &written, started.elapsed(), args.json)
}

/// `submit --bulk`: the shards sealed and uploaded, the workflow started; with `--wait`, the
/// run followed to its end, its results opened and checked, and a report.
pub fn submit_bulk(home: &Home, opened: &Opened, args: &SubmitArgs) -> anyhow::Result<ExitCode> {
    let started = std::time::Instant::now();
    let record = bulk::submit(home, &opened, args)?;
    if !args.wait {
        if args.json {
            println!("{}", serde_json::json!({"bulk_id": record.bulk_id, "prefix": record.prefix, "shards": record.shards.len(), "records": record.records, "local_errors": record.local_errors, "execution": record.execution}));
        } else {
            println!("bulk {}", record.bulk_id);
        }
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "bulk {} submitted: {} records in {} shards under {} ({} refused locally)",
        record.bulk_id,
        record.records,
        record.shards.len(),
        record.prefix,
        record.local_errors
    );
    let services = &opened.services;
    let trust = trust::ClientTrust::load(home, &args.trust)?;
    let (execution, manifest) = bulk::wait(services, &record)?;
    bulk::check_execution(&record, &execution, manifest.as_ref())?;
    bulk::wait_for_ledger(services, &record, manifest.as_ref().expect("checked"))?;
    let key = keys::load_result_key(&home.result_key(), false)?;
    let choice = bulk::OutputChoice { output: args.output.clone(), format: args.format, partial: args.partial };
    let written = bulk::results(home, services, &trust, &key, &record.bulk_id, &choice)?;
    bulk::report(&record.bulk_id, &written, started.elapsed(), args.json);
    Ok(if written.shards_missing.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The summary of a job's results (`--json`: one JSON object).
pub fn report_written(job: &str, written: &results::Written, elapsed: std::time::Duration, json: bool) -> anyhow::Result<ExitCode> {
    let s = &written.summary;
    let ledger_ok = written.verification.checks.iter().any(|c| c.name == "ledger" && c.passed);
    if json {
        println!(
            "{}",
            serde_json::json!({
                "job_id": job,
                "embedded": s.records,
                "errors": s.errors,
                "tokens": s.tokens,
                "seconds": elapsed.as_secs_f64(),
                "output": written.output,
                "errors_file": written.errors,
                "verified": true,
                "in_ledger": ledger_ok,
            })
        );
    } else {
        println!("job {job}");
        println!("  embedded  {} records, {} tokens, {} dimensions", s.records, s.tokens, s.dimensions.unwrap_or(0));
        println!("  errors    {} ({})", s.errors, written.errors.display());
        println!("  output    {}", written.output.display());
        println!("  receipt   verified{}", if written.verification.development_root { " (DEVELOPMENT root)" } else { "" });
        println!("  ledger    {}", if ledger_ok { "entry verified" } else { "not yet in the ledger (see `ephem-batch verify`)" });
        println!("  seconds   {:.1}", elapsed.as_secs_f64());
    }
    Ok(ExitCode::SUCCESS)
}
