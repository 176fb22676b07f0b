//! The embedded default's ledger: one directory (`$EPHEM_HOME/ledger`) holding
//!
//! ```text
//! <dir>/ledger.sqlite   the ledger (SQLite in WAL mode; -wal and -shm files beside it)
//! <dir>/ledger.key      the ledger's Ed25519 note signing key, PRIVATE+KEY+<name>+<id>+<base64>, mode 0600
//! <dir>/ledger.pub      its verifier key, <name>+<id>+<base64>: what auditors pin
//! ```
//!
//! The key is created on first use. Its name, the checkpoints' origin, is fixed then
//! ([`LOCAL_KEY_NAME`] unless [`LocalOptions::key_name`] says otherwise); later opens use
//! whatever key the file holds. Two processes opening an empty directory at once agree
//! on one key: each writes a private temporary file and hard-links it into place, which
//! fails for the loser, who then loads the winner's key.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::entry::{IndexedFields, ReceiptCheck, ReceiptRefusal};
use crate::ledger::{Ledger, LedgerError};
use crate::note::{NoteError, SignerKey, VerifierKey, check_key_name};
use crate::store::{CheckpointPolicy, LedgerStore, SqliteOptions, SqliteStore, StoreError, StoredCheckpoint};

/// The ledger database file.
pub const LEDGER_DB: &str = "ledger.sqlite";
/// The signing key file (secret, mode 0600).
pub const LEDGER_KEY: &str = "ledger.key";
/// The verifier key file (public).
pub const LEDGER_PUB: &str = "ledger.pub";
/// Key name (and checkpoint origin) of a local ledger created with default options.
pub const LOCAL_KEY_NAME: &str = "ephem-batch.local/ledger";

/// Why a local ledger could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("no ledger at {0}")]
    NoLedger(PathBuf),
    #[error("{path}: {error}")]
    Key { path: PathBuf, error: NoteError },
    #[error("{path} is accessible to other users (mode {mode:03o}); it must be 0600")]
    KeyPermissions { path: PathBuf, mode: u32 },
    #[error("the ledger is signed by {stored}, but its signing key {path} is missing")]
    KeyMissing { path: PathBuf, stored: String },
    #[error("the ledger is signed by {stored}, but {path} holds {given}")]
    KeyMismatch { path: PathBuf, stored: String, given: String },
    #[error("{path}: {error}")]
    Store { path: PathBuf, error: StoreError },
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// How a local ledger is opened.
#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// Name of a key created by this open (ignored when the key exists).
    pub key_name: String,
    pub policy: CheckpointPolicy,
    pub sqlite: SqliteOptions,
}

impl Default for LocalOptions {
    fn default() -> Self {
        Self {
            key_name: LOCAL_KEY_NAME.to_owned(),
            policy: CheckpointPolicy::default(),
            sqlite: SqliteOptions::default(),
        }
    }
}

/// Opens the ledger of a directory.
pub struct LocalLedger;

impl LocalLedger {
    /// Opens (creating on first use) the ledger in `dir` for appending, with default
    /// options. Returns the ledger and its verifier key.
    pub fn open(dir: &Path, check: Box<dyn ReceiptCheck>) -> Result<(Ledger<SqliteStore>, VerifierKey), LocalError> {
        Self::open_with(dir, check, &LocalOptions::default())
    }

    /// [`LocalLedger::open`] with explicit options. The key name of `options` only
    /// applies when this open creates the key.
    pub fn open_with(
        dir: &Path,
        check: Box<dyn ReceiptCheck>,
        options: &LocalOptions,
    ) -> Result<(Ledger<SqliteStore>, VerifierKey), LocalError> {
        fs::DirBuilder::new().recursive(true).mode(0o755).create(dir).map_err(io_at(dir))?;
        let db = dir.join(LEDGER_DB);
        let store = SqliteStore::open(&db, &options.sqlite).map_err(store_at(&db))?;
        let stored = store.ledger_key().map_err(store_at(&db))?;
        let key_path = dir.join(LEDGER_KEY);
        let signer = match (read_signer(&key_path)?, &stored) {
            (Some(signer), _) => signer,
            // The first append records the key: a new one would orphan every
            // checkpoint signed since, and every bundle auditors hold.
            (None, Some(stored)) => return Err(LocalError::KeyMissing { path: key_path, stored: stored.clone() }),
            (None, None) => create_signer(&key_path, &options.key_name)?,
        };
        let verifier = signer.verifier();
        if let Some(stored) = stored
            && stored != verifier.to_string()
        {
            return Err(LocalError::KeyMismatch { path: key_path, stored, given: verifier.to_string() });
        }
        write_verifier(&dir.join(LEDGER_PUB), &verifier)?;
        Ok((Ledger::new(store, check, Box::new(signer), options.policy), verifier))
    }

    /// Opens an existing ledger for queries, proofs and verification.
    pub fn open_read_only(dir: &Path) -> Result<SqliteStore, LocalError> {
        let db = dir.join(LEDGER_DB);
        if !db.is_file() {
            return Err(LocalError::NoLedger(dir.to_path_buf()));
        }
        SqliteStore::open_read_only(&db, &SqliteOptions::default()).map_err(store_at(&db))
    }

    /// The verifier key in `dir/ledger.pub`.
    pub fn verifier_key(dir: &Path) -> Result<VerifierKey, LocalError> {
        let path = dir.join(LEDGER_PUB);
        let text = fs::read_to_string(&path).map_err(io_at(&path))?;
        VerifierKey::parse(text.trim_end_matches('\n')).map_err(|error| LocalError::Key { path, error })
    }

    /// Signs a checkpoint of the whole tree now, unless the latest one already covers
    /// it (for a proof of an entry appended since). Needs the signing key.
    pub fn sign_checkpoint(dir: &Path, now_ms: u64) -> Result<Option<StoredCheckpoint>, LocalError> {
        if !dir.join(LEDGER_DB).is_file() {
            return Err(LocalError::NoLedger(dir.to_path_buf()));
        }
        let (mut ledger, _) = Self::open(dir, Box::new(NoAppends))?;
        Ok(ledger.checkpoint_now(now_ms)?)
    }
}

/// The check of a ledger opened only to sign checkpoints.
struct NoAppends;

impl ReceiptCheck for NoAppends {
    fn check(&self, _: &[u8], _: &[u8]) -> Result<IndexedFields, ReceiptRefusal> {
        Err(ReceiptRefusal::NotAppending)
    }
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> LocalError + '_ {
    move |source| LocalError::Io { path: path.to_path_buf(), source }
}

fn store_at(path: &Path) -> impl FnOnce(StoreError) -> LocalError + '_ {
    move |error| LocalError::Store { path: path.to_path_buf(), error }
}

/// The key in `path`, or `None` if there is no file.
fn read_signer(path: &Path) -> Result<Option<SignerKey>, LocalError> {
    let mode = match fs::metadata(path) {
        Ok(m) => m.permissions().mode() & 0o777,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_at(path)(e)),
    };
    if mode & 0o077 != 0 {
        return Err(LocalError::KeyPermissions { path: path.to_path_buf(), mode });
    }
    let text = fs::read_to_string(path).map_err(io_at(path))?;
    let key = SignerKey::parse(text.trim_end_matches('\n'))
        .map_err(|error| LocalError::Key { path: path.to_path_buf(), error })?;
    Ok(Some(key))
}

/// Creates the key file (create-only) and returns the key it holds, which is another
/// process's if that one got there first.
fn create_signer(path: &Path, name: &str) -> Result<SignerKey, LocalError> {
    let bad_name = |error| LocalError::Key { path: path.to_path_buf(), error };
    check_key_name(name).map_err(bad_name)?;
    let key = SignerKey::generate(name).map_err(bad_name)?;
    let tmp = temporary(path);
    let mut text = key.to_secret_string();
    text.push('\n');
    write_new(&tmp, text.as_bytes(), 0o600)?;
    let linked = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => sync_parent(path),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_at(path)(e)),
    }
    read_signer(path)?.ok_or_else(|| io_at(path)(io::ErrorKind::NotFound.into()))
}

/// Writes `ledger.pub` unless it already holds `key` (atomically: temporary + rename).
fn write_verifier(path: &Path, key: &VerifierKey) -> Result<(), LocalError> {
    let text = format!("{key}\n");
    if fs::read_to_string(path).is_ok_and(|t| t == text) {
        return Ok(());
    }
    let tmp = temporary(path);
    write_new(&tmp, text.as_bytes(), 0o644)?;
    fs::rename(&tmp, path).map_err(io_at(path))?;
    sync_parent(path);
    Ok(())
}

fn temporary(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.tmp-{}-{n}", std::process::id()))
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), LocalError> {
    let mut f = OpenOptions::new().write(true).create_new(true).mode(mode).open(path).map_err(io_at(path))?;
    // The umask may have narrowed the mode; a public file must stay readable.
    f.set_permissions(fs::Permissions::from_mode(mode)).map_err(io_at(path))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(io_at(path))
}

/// Best effort: makes a new directory entry durable.
fn sync_parent(path: &Path) {
    if let Some(parent) = path.parent() {
        let _ = File::open(parent).and_then(|d| d.sync_all());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{TestReceipts, test_request};

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn first_open_creates_the_key_and_later_opens_keep_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("home/ledger");
        let (mut ledger, key) = LocalLedger::open(&dir, Box::new(TestReceipts)).unwrap();
        assert_eq!(key.name(), LOCAL_KEY_NAME);
        assert_eq!(mode(&dir.join(LEDGER_KEY)), 0o600);
        assert_eq!(mode(&dir.join(LEDGER_PUB)), 0o644);
        assert_eq!(LocalLedger::verifier_key(&dir).unwrap(), key);
        let secret = fs::read_to_string(dir.join(LEDGER_KEY)).unwrap();
        assert!(secret.starts_with("PRIVATE+KEY+ephem-batch.local/ledger+") && secret.ends_with('\n'));
        assert_eq!(fs::read_to_string(dir.join(LEDGER_PUB)).unwrap(), format!("{key}\n"));

        ledger.append(test_request(1, 100), 1).unwrap();
        ledger.checkpoint_now(2).unwrap();
        drop(ledger);
        let (_, again) = LocalLedger::open(&dir, Box::new(TestReceipts)).unwrap();
        assert_eq!(again, key);
        assert_eq!(fs::read_to_string(dir.join(LEDGER_KEY)).unwrap(), secret);

        let store = LocalLedger::open_read_only(&dir).unwrap();
        assert_eq!(store.size().unwrap(), 1);
        assert_eq!(store.ledger_key().unwrap(), Some(key.to_string()));
        let cp = store.latest_checkpoint().unwrap().unwrap();
        crate::Checkpoint::open(cp.note.as_bytes(), &key).unwrap();
    }

    #[test]
    fn the_public_key_file_is_restored() {
        let tmp = tempfile::tempdir().unwrap();
        let (_, key) = LocalLedger::open(tmp.path(), Box::new(TestReceipts)).unwrap();
        fs::write(tmp.path().join(LEDGER_PUB), "someone+00000000+AAAA\n").unwrap();
        LocalLedger::open(tmp.path(), Box::new(TestReceipts)).unwrap();
        assert_eq!(LocalLedger::verifier_key(tmp.path()).unwrap(), key);
    }

    #[test]
    fn key_problems_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (mut ledger, key) = LocalLedger::open(dir, Box::new(TestReceipts)).unwrap();
        ledger.append(test_request(1, 100), 1).unwrap();
        ledger.checkpoint_now(2).unwrap();
        drop(ledger);
        let key_path = dir.join(LEDGER_KEY);
        let secret = fs::read_to_string(&key_path).unwrap();

        fs::set_permissions(&key_path, fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(
            LocalLedger::open(dir, Box::new(TestReceipts)),
            Err(LocalError::KeyPermissions { mode: 0o640, .. })
        ));

        // A key that is not the ledger's: refused before anything is signed with it.
        let other = SignerKey::generate(LOCAL_KEY_NAME).unwrap();
        fs::remove_file(&key_path).unwrap();
        write_new(&key_path, format!("{}\n", other.to_secret_string()).as_bytes(), 0o600).unwrap();
        match LocalLedger::open(dir, Box::new(TestReceipts)) {
            Err(LocalError::KeyMismatch { stored, given, .. }) => {
                assert_eq!(stored, key.to_string());
                assert_eq!(given, other.verifier().to_string());
            }
            other => panic!("{:?}", other.map(|_| ())),
        }

        // A lost key is not silently replaced.
        fs::remove_file(&key_path).unwrap();
        assert!(matches!(LocalLedger::open(dir, Box::new(TestReceipts)), Err(LocalError::KeyMissing { .. })));
        assert!(!key_path.exists());

        write_new(&key_path, b"PRIVATE+KEY+garbage\n", 0o600).unwrap();
        assert!(matches!(LocalLedger::open(dir, Box::new(TestReceipts)), Err(LocalError::Key { .. })));
        fs::remove_file(&key_path).unwrap();
        write_new(&key_path, secret.as_bytes(), 0o600).unwrap();
        LocalLedger::open(dir, Box::new(TestReceipts)).unwrap();
    }

    #[test]
    fn bad_key_names_and_missing_ledgers() {
        let tmp = tempfile::tempdir().unwrap();
        let options = LocalOptions { key_name: "two words".into(), ..LocalOptions::default() };
        assert!(matches!(
            LocalLedger::open_with(tmp.path(), Box::new(TestReceipts), &options),
            Err(LocalError::Key { error: NoteError::BadKeyName(_), .. })
        ));
        let empty = tmp.path().join("nothing");
        assert!(matches!(LocalLedger::open_read_only(&empty), Err(LocalError::NoLedger(_))));
        assert!(matches!(LocalLedger::sign_checkpoint(&empty, 1), Err(LocalError::NoLedger(_))));
        assert!(matches!(LocalLedger::verifier_key(&empty), Err(LocalError::Io { .. })));
    }

    #[test]
    fn sign_checkpoint_covers_the_whole_tree_once() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut ledger, key) = LocalLedger::open(tmp.path(), Box::new(TestReceipts)).unwrap();
        for j in 0..3 {
            ledger.append(test_request(j, 100), j).unwrap();
        }
        drop(ledger);
        let cp = LocalLedger::sign_checkpoint(tmp.path(), 10).unwrap().unwrap();
        assert_eq!(cp.size, 3);
        assert_eq!(crate::Checkpoint::open(cp.note.as_bytes(), &key).unwrap().size, 3);
        assert_eq!(LocalLedger::sign_checkpoint(tmp.path(), 11).unwrap(), None);
    }

    #[test]
    fn concurrent_first_opens_agree_on_one_key() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ledger");
        let keys: Vec<VerifierKey> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| LocalLedger::open(&dir, Box::new(TestReceipts)).map(|(_, k)| k).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(keys.iter().all(|k| *k == keys[0]), "{keys:?}");
        assert_eq!(LocalLedger::verifier_key(&dir).unwrap(), keys[0]);
        let leftovers: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains(".tmp-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}
