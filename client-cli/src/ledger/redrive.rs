//! `ephem-batch ledger redrive`: the operator's way back for receipts in the ledger's
//! dead-letter queue, once what held them is fixed — a policy uploaded for a new image, a store
//! or a grant repaired. Each message goes back to the ledger queue in its group, oldest first
//! (`cloud::redrive`), and `ledger-append` appends them in that order.
//!
//! With `--backend aws` the queues are the deployment's (`LedgerDlqUrl`, `LedgerQueueUrl`);
//! locally, the home's. SQS's own `StartMessageMoveTask` moves FIFO dead letters too (docs/
//! operations.md, "Redrive"); this command is the same on every backend, emulators included.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use clap::Args;
use cloud::Queue;

use crate::backend::Opened;

#[derive(Args, Debug, Clone, Default)]
pub struct RedriveArgs {
    /// Move at most this many messages (default: every one there).
    #[arg(long, value_name = "N")]
    pub max: Option<u64>,
    /// One JSON object: the messages moved, in order.
    #[arg(long)]
    pub json: bool,
}

/// The ledger's dead-letter queue and the ledger queue of the opened backend.
fn queues(opened: &Opened) -> anyhow::Result<(Arc<dyn Queue>, Arc<dyn Queue>)> {
    let source = opened.services.ledger_queue.clone();
    if let Some(local) = &opened.local {
        return Ok((local.ledger_dlq(), source));
    }
    let aws = opened.aws.as_ref().ok_or_else(|| anyhow!("no backend opened"))?;
    let dlq = aws.ledger_dlq().ok_or_else(|| {
        anyhow!("the AWS settings name no ledger dead-letter queue ({} / LedgerDlqUrl)", "EPHEM_LEDGER_DLQ_URL")
    })?;
    Ok((Arc::new(dlq), source))
}

pub fn redrive_command(opened: &Opened, args: &RedriveArgs) -> anyhow::Result<ExitCode> {
    let (dlq, source) = queues(opened)?;
    let (report, error) = cloud::redrive::redrive(dlq.as_ref(), source.as_ref(), args.max.unwrap_or(u64::MAX), Duration::from_secs(1));
    if args.json {
        let out = serde_json::json!({
            "ok": error.is_none(),
            "from": dlq.name(),
            "to": source.name(),
            "moved": report.moved,
            "error": error.as_ref().map(ToString::to_string),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for m in &report.moved {
            println!("sent back {} (job {}, received {} time(s) before)", m.message_id, m.job_id.map_or_else(|| "-".to_owned(), |j| j.to_hex()), m.receive_count);
        }
        println!("{} message(s) moved from {} to {}", report.moved.len(), dlq.name(), source.name());
    }
    match error {
        None => Ok(ExitCode::SUCCESS),
        Some(error) => {
            eprintln!("redrive stopped: {error}");
            Ok(ExitCode::from(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloud::SendOptions;

    /// The embedded default's queues: receipts dead-lettered after their receives come back to
    /// the ledger queue, oldest first, in their group.
    #[test]
    fn the_home_s_dead_letters_go_back_to_its_ledger_queue() {
        let tmp = tempfile::tempdir().unwrap();
        let home = crate::home::Home::resolve(Some(tmp.path())).unwrap();
        // Only the queues matter here: no upload runs anything.
        crate::backend::install_local_wiring(|_, _| {});
        let opened = crate::backend::open(&home, &crate::backend::BackendArgs::default()).unwrap();
        let local = opened.local.as_ref().unwrap();
        let ledger = local.ledger_queue();
        for n in 0..3 {
            let options = SendOptions { group_id: Some("ledger".into()), deduplication_id: Some(format!("job-{n}")), ..Default::default() };
            ledger.send(&format!("receipt {n}"), &options).unwrap();
        }
        while !ledger.peek().unwrap().is_empty() {
            ledger.receive(10, Duration::ZERO, Duration::ZERO).unwrap();
        }
        assert_eq!(local.ledger_dlq().peek().unwrap().len(), 3);

        let code = redrive_command(&opened, &RedriveArgs { max: Some(2), json: true }).unwrap();
        assert_eq!(code, ExitCode::SUCCESS);
        let back: Vec<String> = ledger.peek().unwrap().into_iter().map(|m| m.body).collect();
        assert_eq!(back, ["receipt 0", "receipt 1"]);
        redrive_command(&opened, &RedriveArgs::default()).unwrap();
        assert_eq!(ledger.peek().unwrap().len(), 3);
        assert!(local.ledger_dlq().peek().unwrap().is_empty());
    }
}
