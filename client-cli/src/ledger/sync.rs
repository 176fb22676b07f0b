//! `ledger sync`: a deployment's tlog-tiles ledger copied into the home under a pinned key.

use super::*;

// ---- sync ------------------------------------------------------------------------------

/// Where `--from` points: a bucket (and prefix) or a directory.
pub(super) fn ledger_objects(from: &str) -> anyhow::Result<(std::sync::Arc<dyn cloud::ObjectStore>, String)> {
    if let Some(rest) = from.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(anyhow!("--from {from:?} names no bucket"));
        }
        let clients = cloud_aws::AwsClients::connect(None, None).context("connecting to S3")?;
        return Ok((std::sync::Arc::new(clients.object_store(bucket, "")), prefix.to_owned()));
    }
    let dir = Path::new(from);
    if !dir.is_dir() {
        return Err(anyhow!("--from {from:?} is neither s3://BUCKET[/PREFIX] nor a directory"));
    }
    let store = cloud_local::DirObjectStore::open(dir).with_context(|| format!("opening {from}"))?;
    Ok((std::sync::Arc::new(store), String::new()))
}

#[derive(Serialize)]
pub(super) struct SyncJson<'a> {
    ok: bool,
    ledger_key: String,
    copy: String,
    sync: &'a tiles::SyncReport,
    audit: Option<&'a tiles::AuditReport>,
}

/// The copy in `dir` (`ledger.sqlite`) of the tlog-tiles ledger in `objects` under `prefix`,
/// brought up to the bucket's checkpoint, every checkpoint checked against `key`; `ledger.pub`
/// then pins `key` for the copy's commands. `Ok(Err(..))`: the bucket's ledger was refused.
pub fn sync_copy(
    dir: &Path,
    objects: std::sync::Arc<dyn cloud::ObjectStore>,
    prefix: &str,
    key: &VerifierKey,
) -> anyhow::Result<Result<(tiles::TileStore, tiles::SyncReport), tiles::TileError>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let db = dir.join(receipts_ledger::local::LEDGER_DB);
    let mut store = tiles::TileStore::open(
        objects,
        tiles::layout::Layout::new(prefix),
        tiles::Cache::File(db.clone()),
        key.clone(),
        tiles::TileOptions::auditor(),
    )
    .with_context(|| format!("opening the copy {}", db.display()))?;
    let report = match tiles::sync(&mut store) {
        Ok(report) => report,
        Err(e) => return Ok(Err(e)),
    };
    // The copy's commands trust the key it was synced under.
    let pub_path = dir.join(receipts_ledger::local::LEDGER_PUB);
    std::fs::write(&pub_path, format!("{key}\n")).with_context(|| format!("writing {}", pub_path.display()))?;
    Ok(Ok((store, report)))
}

pub(super) fn sync_command(dir: &Path, from: &str, ledger_key: &str, audit: bool, json: bool) -> anyhow::Result<ExitCode> {
    let pinned = parse_ledger_key(ledger_key)?;
    let (objects, prefix) = ledger_objects(from)?;
    let db = dir.join(receipts_ledger::local::LEDGER_DB);
    let (store, report) = match sync_copy(dir, objects, &prefix, &pinned.key)? {
        Ok(synced) => synced,
        Err(e) => {
            eprintln!("sync refused: {e}");
            return Ok(ExitCode::from(1));
        }
    };
    let audit = if audit { Some(tiles::audit(&store)?) } else { None };
    // Metadata that says something else than its receipt was not used, but someone wrote it.
    let ok = audit.as_ref().is_none_or(tiles::AuditReport::ok) && report.altered_metadata.is_empty();
    if json {
        let out = SyncJson { ok, ledger_key: pinned.key.to_string(), copy: db.display().to_string(), sync: &report, audit: audit.as_ref() };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "synced {from} into {}: {} -> {} entries, {} checkpoint(s), root {}",
            db.display(),
            report.from,
            report.size,
            report.checkpoints,
            report.root.as_deref().unwrap_or("(empty ledger)")
        );
        println!("ledger key {} ({})", pinned.key, pinned.source);
        if let Some(a) = &audit {
            println!(
                "audit: {} hash tile(s), {} entry bundle(s), {} metadata bundle(s) match; {} newer object(s) not checked",
                a.hash_tiles, a.entry_bundles, a.meta_bundles, a.beyond
            );
            for p in &a.problems {
                println!("  MISMATCH {}: {}", p.key, p.problem);
            }
        }
        for m in &report.altered_metadata {
            println!("ALTERED {}: entry {} {} differs from its receipt (the receipt's was used)", m.key, m.index, m.field);
        }
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
