//! [`DirObjectStore`]: S3's semantics on a local directory.
//!
//! An object `a/b/c` is the file `<root>/a/b/c`, so the store stays browsable with `ls`. Two
//! internal names live at the root and can never be keys: `.tmp/` (writes in progress) and
//! `.lock` (the lock file).
//!
//! * **Atomic writes.** Every write goes to a fresh file under `.tmp/`, is fsynced, and is then
//!   renamed (or hard-linked) into place, so a reader opens either the old inode or the new
//!   one, never a mix; an open reader keeps its inode to the end.
//! * **Conditions.** The step that places a file (and `delete`) runs under an exclusive lock on
//!   `.lock` — `flock`, so it holds across processes — which makes `IfMatch` a real
//!   compare-and-swap and orders every mutation. `CreateOnly` places the file with
//!   `hard_link`, which fails by itself if the key exists.
//! * **Etags** hash the inode, the modification time (ns) and the size: cheap, and every write
//!   makes a new inode.
//! * **Created hooks** emulate S3 event notifications: after a successful write whose key
//!   matches a hook's prefix and suffix, the hook runs in the writing thread (locally that is
//!   how the `on-upload` handler is called). Hooks are per process: only writes made through
//!   this `DirObjectStore` value fire them.
//!
//! One difference from S3 remains: a key cannot be both an object and a "folder" of other keys
//! (`a` and `a/b`), because a path cannot be both a file and a directory. Such a write fails
//! with [`ObjectError::InvalidKey`] naming the collision.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use cloud::objects::{ObjectError, ObjectMeta, ObjectStore, ObjectWriter, PutCondition};

mod copy;

/// Where writes in progress live (same file system as the objects, so rename is atomic).
pub const TEMP_DIR: &str = ".tmp";
/// The lock file that orders mutations across processes.
pub const LOCK_FILE: &str = ".lock";
/// S3's limit on key length (bytes of UTF-8).
pub const MAX_KEY_LEN: usize = 1024;
/// The usual file-system limit on one path component.
pub const MAX_SEGMENT_LEN: usize = 255;
/// A temporary file untouched for this long belongs to a writer that died; `open` removes it.
/// Long enough that a slow streaming writer in another process is never cut off.
pub const STALE_TEMP_AGE: Duration = Duration::from_secs(3600);
/// Delays before the retries of a failing created hook.
const HOOK_RETRY_DELAYS: [Duration; 3] =
    [Duration::from_millis(50), Duration::from_millis(200), Duration::from_millis(500)];

/// Called after a successful write of a matching key (an S3 `ObjectCreated` event).
pub type CreatedHook = Arc<dyn Fn(&ObjectMeta) -> Result<(), String> + Send + Sync>;

/// An object store in a directory (see the module documentation).
#[derive(Clone)]
pub struct DirObjectStore {
    inner: Arc<Inner>,
}

struct Inner {
    root: PathBuf,
    tmp: PathBuf,
    /// Threads of this process take the mutex; processes take the `flock` on the file.
    lock: Mutex<File>,
    hooks: RwLock<Vec<HookEntry>>,
}

struct HookEntry {
    prefix: String,
    suffix: String,
    hook: CreatedHook,
}

impl std::fmt::Debug for DirObjectStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirObjectStore").field("root", &self.inner.root).finish()
    }
}

impl DirObjectStore {
    /// Opens (creating if needed) a store rooted at `root`, and removes stale temporary files.
    pub fn open(root: impl AsRef<Path>) -> Result<DirObjectStore, ObjectError> {
        let root = root.as_ref().to_path_buf();
        let tmp = root.join(TEMP_DIR);
        let root_label = root.display().to_string();
        fs::create_dir_all(&tmp).map_err(|e| ObjectError::io(&root_label, e))?;
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(root.join(LOCK_FILE))
            .map_err(|e| ObjectError::io(&root_label, e))?;
        remove_stale_temps(&tmp);
        Ok(DirObjectStore {
            inner: Arc::new(Inner { root, tmp, lock: Mutex::new(lock), hooks: RwLock::new(Vec::new()) }),
        })
    }

    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// Registers `hook` for writes whose key starts with `prefix` and ends with `suffix`
    /// (replacing an earlier hook for the same pair). A failing hook is retried a few times
    /// and then logged; the write itself has succeeded either way.
    pub fn set_created_hook(&self, prefix: &str, suffix: &str, hook: CreatedHook) {
        let mut hooks = self.inner.hooks.write().unwrap_or_else(|e| e.into_inner());
        hooks.retain(|h| !(h.prefix == prefix && h.suffix == suffix));
        hooks.push(HookEntry { prefix: prefix.to_owned(), suffix: suffix.to_owned(), hook });
    }

    /// Removes the hook registered for exactly this prefix and suffix.
    pub fn clear_created_hook(&self, prefix: &str, suffix: &str) {
        let mut hooks = self.inner.hooks.write().unwrap_or_else(|e| e.into_inner());
        hooks.retain(|h| !(h.prefix == prefix && h.suffix == suffix));
    }
}

/// Checks a key against S3's rules and the directory mapping's.
pub fn validate_key(key: &str) -> Result<(), ObjectError> {
    let invalid = |reason| Err(ObjectError::InvalidKey { key: key.to_owned(), reason });
    if key.is_empty() {
        return invalid("empty");
    }
    if key.len() > MAX_KEY_LEN {
        return invalid("longer than 1024 bytes");
    }
    if key.starts_with('/') {
        return invalid("starts with '/'");
    }
    if key.chars().any(char::is_control) {
        return invalid("contains a NUL or control character");
    }
    for segment in key.split('/') {
        match segment {
            "" => return invalid("has an empty path segment ('//' or a trailing '/')"),
            "." | ".." => return invalid("has a '.' or '..' path segment"),
            s if s.len() > MAX_SEGMENT_LEN => return invalid("has a path segment longer than 255 bytes"),
            _ => {}
        }
    }
    let first = key.split('/').next().unwrap_or_default();
    if first == TEMP_DIR || first == LOCK_FILE {
        return invalid("starts with a name reserved for the store's internals (.tmp, .lock)");
    }
    Ok(())
}

const COLLISION: &str = "collides with another key: a directory store cannot hold both `a` and `a/…`";

impl Inner {
    fn path_of(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    /// The exclusive store lock: in-process mutex, then `flock` for other processes.
    fn lock(&self, key: &str) -> Result<StoreLock<'_>, ObjectError> {
        let file = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        file.lock().map_err(|e| ObjectError::io(key, e))?;
        Ok(StoreLock { file })
    }

    fn new_temp(&self, key: &str) -> Result<(TempFile, File), ObjectError> {
        let mut name = [0u8; 16];
        getrandom::fill(&mut name).map_err(|e| ObjectError::io(key, io::Error::other(e.to_string())))?;
        let path = self.tmp.join(hex::encode(name));
        let file = OpenOptions::new().write(true).create_new(true).open(&path).map_err(|e| ObjectError::io(key, e))?;
        Ok((TempFile { path: Some(path) }, file))
    }

    /// Moves a complete, fsynced temporary file to `key` if `condition` holds.
    fn place(&self, key: &str, mut temp: TempFile, condition: &PutCondition) -> Result<ObjectMeta, ObjectError> {
        let dest = self.path_of(key);
        let _lock = self.lock(key)?;
        let current = stat_object(key, &dest)?;
        match condition {
            PutCondition::Overwrite => {}
            PutCondition::CreateOnly => {
                if current.is_some() {
                    return Err(ObjectError::AlreadyExists { key: key.to_owned() });
                }
            }
            PutCondition::IfMatch(etag) => match &current {
                // S3 answers If-Match on a missing key with 404.
                None => return Err(ObjectError::NotFound { key: key.to_owned() }),
                Some(meta) if &meta.etag != etag => {
                    return Err(ObjectError::PreconditionFailed { key: key.to_owned() });
                }
                Some(_) => {}
            },
        }
        self.make_parents(key, &dest)?;
        let temp_path = temp.path.clone().unwrap_or_default();
        match condition {
            // hard_link refuses an existing destination atomically, lock or not.
            PutCondition::CreateOnly => match fs::hard_link(&temp_path, &dest) {
                Ok(()) => drop(temp), // removes the temporary name; the object keeps the inode
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    return Err(if dest.is_dir() {
                        ObjectError::InvalidKey { key: key.to_owned(), reason: COLLISION }
                    } else {
                        ObjectError::AlreadyExists { key: key.to_owned() }
                    });
                }
                Err(e) => return Err(place_error(key, &dest, e)),
            },
            _ => {
                if dest.is_dir() {
                    return Err(ObjectError::InvalidKey { key: key.to_owned(), reason: COLLISION });
                }
                fs::rename(&temp_path, &dest).map_err(|e| place_error(key, &dest, e))?;
                temp.path = None;
            }
        }
        sync_dir(dest.parent());
        stat_object(key, &dest)?.ok_or_else(|| ObjectError::io(key, io::Error::other("object vanished after write")))
    }

    fn make_parents(&self, key: &str, dest: &Path) -> Result<(), ObjectError> {
        let Some(parent) = dest.parent() else { return Ok(()) };
        fs::create_dir_all(parent).map_err(|e| {
            // A file where a directory should be: another key is a prefix of this one.
            if e.kind() == io::ErrorKind::AlreadyExists || e.kind() == io::ErrorKind::NotADirectory {
                ObjectError::InvalidKey { key: key.to_owned(), reason: COLLISION }
            } else {
                ObjectError::io(key, e)
            }
        })
    }

    fn fire_created(&self, meta: &ObjectMeta) {
        let hooks: Vec<CreatedHook> = {
            let hooks = self.hooks.read().unwrap_or_else(|e| e.into_inner());
            hooks
                .iter()
                .filter(|h| meta.key.starts_with(&h.prefix) && meta.key.ends_with(&h.suffix))
                .map(|h| h.hook.clone())
                .collect()
        };
        for hook in hooks {
            let mut outcome = hook(meta);
            for delay in HOOK_RETRY_DELAYS {
                if outcome.is_ok() {
                    break;
                }
                std::thread::sleep(delay);
                outcome = hook(meta);
            }
            if let Err(message) = outcome {
                tracing::warn!(
                    key = %meta.key,
                    attempts = HOOK_RETRY_DELAYS.len() + 1,
                    "created hook failed; the object is stored but the event was not handled: {message}"
                );
            }
        }
    }

    fn commit(&self, key: &str, temp: TempFile, condition: &PutCondition) -> Result<ObjectMeta, ObjectError> {
        let meta = self.place(key, temp, condition)?;
        self.fire_created(&meta);
        Ok(meta)
    }

    /// Fails early (before any bytes are written) when the condition already cannot hold.
    fn precheck(&self, key: &str, condition: &PutCondition) -> Result<(), ObjectError> {
        let current = || stat_object(key, &self.path_of(key));
        match condition {
            PutCondition::Overwrite => Ok(()),
            PutCondition::CreateOnly => match current()? {
                Some(_) => Err(ObjectError::AlreadyExists { key: key.to_owned() }),
                None => Ok(()),
            },
            PutCondition::IfMatch(etag) => match current()? {
                None => Err(ObjectError::NotFound { key: key.to_owned() }),
                Some(meta) if &meta.etag != etag => Err(ObjectError::PreconditionFailed { key: key.to_owned() }),
                Some(_) => Ok(()),
            },
        }
    }

    /// Opens an object's current version (a regular file, not a "folder").
    fn open_object(&self, key: &str) -> Result<(File, u64), ObjectError> {
        validate_key(key)?;
        let not_found = || ObjectError::NotFound { key: key.to_owned() };
        let file = match File::open(self.path_of(key)) {
            Ok(f) => f,
            Err(e) if is_missing(&e) => return Err(not_found()),
            Err(e) => return Err(ObjectError::io(key, e)),
        };
        let meta = file.metadata().map_err(|e| ObjectError::io(key, e))?;
        if !meta.is_file() {
            return Err(not_found());
        }
        Ok((file, meta.len()))
    }

    /// Removes empty directories from `dir` up to (not including) the root, so a deleted
    /// "folder" does not block a later key of the same name.
    fn prune_empty_dirs(&self, mut dir: Option<&Path>) {
        while let Some(d) = dir {
            if d == self.root || !d.starts_with(&self.root) || fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
    }

    fn walk(&self, dir: &Path, key_prefix: &str, want: &str, out: &mut Vec<ObjectMeta>) -> Result<(), ObjectError> {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            // A concurrent delete may remove a directory while we walk.
            Err(e) if is_missing(&e) => return Ok(()),
            Err(e) => return Err(ObjectError::io(key_prefix, e)),
        };
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) if is_missing(&e) => continue,
                Err(e) => return Err(ObjectError::io(key_prefix, e)),
            };
            let Ok(name) = entry.file_name().into_string() else { continue };
            if key_prefix.is_empty() && (name == TEMP_DIR || name == LOCK_FILE) {
                continue;
            }
            let key = format!("{key_prefix}{name}");
            if validate_key(&key).is_err() {
                continue; // not something this store wrote
            }
            let path = entry.path();
            let Ok(meta) = fs::metadata(&path) else { continue };
            if meta.is_dir() {
                let sub = format!("{key}/");
                if sub.starts_with(want) || want.starts_with(&sub) {
                    self.walk(&path, &sub, want, out)?;
                }
            } else if meta.is_file() && key.starts_with(want) {
                out.push(object_meta(key, &meta));
            }
        }
        Ok(())
    }
}

/// Held while a mutation runs; releases the `flock` (then the mutex) on drop.
struct StoreLock<'a> {
    file: MutexGuard<'a, File>,
}

impl Drop for StoreLock<'_> {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

/// A temporary file that is removed unless it was moved into place.
struct TempFile {
    path: Option<PathBuf>,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = fs::remove_file(path);
        }
    }
}

fn is_missing(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.kind() == io::ErrorKind::NotADirectory
}

fn place_error(key: &str, dest: &Path, e: io::Error) -> ObjectError {
    if e.kind() == io::ErrorKind::NotADirectory || e.kind() == io::ErrorKind::IsADirectory || dest.is_dir() {
        ObjectError::InvalidKey { key: key.to_owned(), reason: COLLISION }
    } else {
        ObjectError::io(key, e)
    }
}

/// The object at `path`, if it is a regular file.
fn stat_object(key: &str, path: &Path) -> Result<Option<ObjectMeta>, ObjectError> {
    match fs::metadata(path) {
        Ok(meta) if meta.is_file() => Ok(Some(object_meta(key.to_owned(), &meta))),
        Ok(_) => Ok(None),
        Err(e) if is_missing(&e) => Ok(None),
        Err(e) => Err(ObjectError::io(key, e)),
    }
}

fn object_meta(key: String, meta: &fs::Metadata) -> ObjectMeta {
    let modified = meta.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).unwrap_or_default();
    ObjectMeta { key, size: meta.len(), etag: etag(meta, modified), modified_ms: modified.as_millis() as u64 }
}

/// Changes with every write: each write is a new inode, and mtime and size come along.
fn etag(meta: &fs::Metadata, modified: Duration) -> String {
    let mut h = Sha256::new();
    h.update(inode(meta).to_be_bytes());
    h.update(modified.as_nanos().to_be_bytes());
    h.update(meta.len().to_be_bytes());
    hex::encode(&h.finalize()[..16])
}

#[cfg(unix)]
fn inode(meta: &fs::Metadata) -> u128 {
    use std::os::unix::fs::MetadataExt;
    (u128::from(meta.dev()) << 64) | u128::from(meta.ino())
}

#[cfg(not(unix))]
fn inode(_meta: &fs::Metadata) -> u128 {
    0
}

/// Makes a rename durable (best effort: not every platform can fsync a directory).
fn sync_dir(dir: Option<&Path>) {
    if let Some(dir) = dir
        && let Ok(d) = File::open(dir)
    {
        let _ = d.sync_all();
    }
}

fn remove_stale_temps(tmp: &Path) {
    let Ok(entries) = fs::read_dir(tmp) else { return };
    let now = SystemTime::now();
    for entry in entries.flatten() {
        let stale = entry
            .metadata()
            .and_then(|m| m.modified())
            .map(|t| now.duration_since(t).unwrap_or_default() > STALE_TEMP_AGE)
            .unwrap_or(false);
        if stale {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// A streaming write into a temporary file; see [`ObjectWriter`].
struct DirWriter {
    // Declared before `temp`, so an abandoned writer closes its file before the file is removed.
    out: BufWriter<File>,
    temp: TempFile,
    inner: Arc<Inner>,
    key: String,
    condition: PutCondition,
}

impl Write for DirWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

impl ObjectWriter for DirWriter {
    fn commit(self: Box<Self>) -> Result<ObjectMeta, ObjectError> {
        let DirWriter { out, temp, inner, key, condition } = *self;
        let file = out.into_inner().map_err(|e| ObjectError::io(&key, e.into_error()))?;
        file.sync_all().map_err(|e| ObjectError::io(&key, e))?;
        drop(file);
        inner.commit(&key, temp, &condition)
    }
}

impl ObjectStore for DirObjectStore {
    fn put(&self, key: &str, bytes: &[u8], condition: PutCondition) -> Result<ObjectMeta, ObjectError> {
        validate_key(key)?;
        self.inner.precheck(key, &condition)?;
        let (temp, mut file) = self.inner.new_temp(key)?;
        file.write_all(bytes).and_then(|()| file.sync_all()).map_err(|e| ObjectError::io(key, e))?;
        drop(file);
        self.inner.commit(key, temp, &condition)
    }

    fn writer(&self, key: &str, condition: PutCondition) -> Result<Box<dyn ObjectWriter>, ObjectError> {
        validate_key(key)?;
        self.inner.precheck(key, &condition)?;
        let (temp, file) = self.inner.new_temp(key)?;
        Ok(Box::new(DirWriter {
            inner: self.inner.clone(),
            key: key.to_owned(),
            condition,
            temp,
            out: BufWriter::with_capacity(64 * 1024, file),
        }))
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, ObjectError> {
        let (mut file, len) = self.inner.open_object(key)?;
        let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        file.read_to_end(&mut bytes).map_err(|e| ObjectError::io(key, e))?;
        Ok(bytes)
    }

    fn reader(&self, key: &str) -> Result<Box<dyn Read + Send>, ObjectError> {
        let (file, _) = self.inner.open_object(key)?;
        Ok(Box::new(BufReader::with_capacity(64 * 1024, file)))
    }

    fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>, ObjectError> {
        let (mut file, size) = self.inner.open_object(key)?;
        let available = size.saturating_sub(offset).min(len);
        if available == 0 {
            return Ok(Vec::new());
        }
        file.seek(SeekFrom::Start(offset)).map_err(|e| ObjectError::io(key, e))?;
        let mut bytes = Vec::with_capacity(usize::try_from(available).unwrap_or(0));
        file.take(available).read_to_end(&mut bytes).map_err(|e| ObjectError::io(key, e))?;
        Ok(bytes)
    }

    fn head(&self, key: &str) -> Result<Option<ObjectMeta>, ObjectError> {
        validate_key(key)?;
        stat_object(key, &self.inner.path_of(key))
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, ObjectError> {
        let mut out = Vec::new();
        self.inner.walk(&self.inner.root, "", prefix, &mut out)?;
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    fn list_page(&self, prefix: &str, start_after: Option<&str>, max_keys: usize) -> Result<Vec<ObjectMeta>, ObjectError> {
        // A folder walk has no order to start from; what it returns is bounded all the same.
        let mut out = Vec::new();
        self.inner.walk(&self.inner.root, "", prefix, &mut out)?;
        out.retain(|meta| start_after.is_none_or(|after| meta.key.as_str() > after));
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out.truncate(max_keys);
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<(), ObjectError> {
        validate_key(key)?;
        let path = self.inner.path_of(key);
        let _lock = self.inner.lock(key)?;
        if stat_object(key, &path)?.is_none() {
            return Ok(()); // missing, or a "folder" rather than an object: nothing to delete
        }
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if is_missing(&e) => return Ok(()),
            Err(e) => return Err(ObjectError::io(key, e)),
        }
        self.inner.prune_empty_dirs(path.parent());
        Ok(())
    }

    fn copy(&self, from: &str, to: &str, source_etag: Option<&str>, condition: PutCondition) -> Result<ObjectMeta, ObjectError> {
        self.copy_file(from, to, source_etag, condition)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;

    use super::*;

    fn store() -> (tempfile::TempDir, DirObjectStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = DirObjectStore::open(dir.path().join("objects")).unwrap();
        (dir, store)
    }

    #[test]
    fn put_get_head_list_delete() {
        let (_dir, s) = store();
        let meta = s.put("jobs/a/input.sealed", b"hello", PutCondition::Overwrite).unwrap();
        assert_eq!(meta.size, 5);
        assert_eq!(meta.key, "jobs/a/input.sealed");
        assert_eq!(s.get("jobs/a/input.sealed").unwrap(), b"hello");
        assert_eq!(s.head("jobs/a/input.sealed").unwrap(), Some(meta.clone()));
        assert_eq!(s.head("jobs/a/nothing").unwrap(), None);
        assert_eq!(s.head("jobs/a").unwrap(), None, "a folder is not an object");
        assert!(matches!(s.get("jobs/a"), Err(ObjectError::NotFound { .. })));
        assert!(matches!(s.get("jobs/b/x"), Err(ObjectError::NotFound { .. })));

        let mut r = String::new();
        s.reader("jobs/a/input.sealed").unwrap().read_to_string(&mut r).unwrap();
        assert_eq!(r, "hello");

        s.put("jobs/b/x", b"1", PutCondition::Overwrite).unwrap();
        s.put("jobs/a/attempts/1/output.sealed", b"22", PutCondition::Overwrite).unwrap();
        s.put("jobsx", b"3", PutCondition::Overwrite).unwrap();
        let keys = |p: &str| s.list(p).unwrap().into_iter().map(|m| m.key).collect::<Vec<_>>();
        assert_eq!(keys(""), ["jobs/a/attempts/1/output.sealed", "jobs/a/input.sealed", "jobs/b/x", "jobsx"]);
        assert_eq!(keys("jobs/"), ["jobs/a/attempts/1/output.sealed", "jobs/a/input.sealed", "jobs/b/x"]);
        assert_eq!(keys("jobs/a/"), ["jobs/a/attempts/1/output.sealed", "jobs/a/input.sealed"]);
        assert_eq!(keys("jobs/a/in"), ["jobs/a/input.sealed"]);
        assert_eq!(keys("jobs"), ["jobs/a/attempts/1/output.sealed", "jobs/a/input.sealed", "jobs/b/x", "jobsx"]);
        assert!(keys("nope/").is_empty());

        s.delete("jobs/a/attempts/1/output.sealed").unwrap();
        s.delete("jobs/a/attempts/1/output.sealed").unwrap(); // missing: Ok, as in S3
        s.delete("never/was").unwrap();
        assert!(!s.root().join("jobs/a/attempts").exists(), "empty folders are pruned");
        assert_eq!(keys("jobs/a/"), ["jobs/a/input.sealed"]);
        // The pruned folder name can now be an object.
        s.put("jobs/a/attempts", b"now a file", PutCondition::CreateOnly).unwrap();
    }

    #[test]
    fn read_range_clamps_at_the_end() {
        let (_dir, s) = store();
        s.put("k", b"0123456789", PutCondition::Overwrite).unwrap();
        assert_eq!(s.read_range("k", 2, 3).unwrap(), b"234");
        assert_eq!(s.read_range("k", 8, 100).unwrap(), b"89");
        assert_eq!(s.read_range("k", 10, 5).unwrap(), b"");
        assert_eq!(s.read_range("k", 50, 5).unwrap(), b"");
        assert!(matches!(s.read_range("missing", 0, 1), Err(ObjectError::NotFound { .. })));
    }

    #[test]
    fn keys_are_validated() {
        let (_dir, s) = store();
        let long = "a".repeat(1025);
        let long_segment = format!("a/{}", "b".repeat(256));
        for bad in ["", "/abs", "a//b", "a/", "./a", "a/../b", "a/.", "a\0b", "a\nb", "a\u{7f}", ".tmp/x", ".lock", &long, &long_segment]
        {
            assert!(
                matches!(s.put(bad, b"x", PutCondition::Overwrite), Err(ObjectError::InvalidKey { .. })),
                "{bad:?} accepted"
            );
            assert!(matches!(s.get(bad), Err(ObjectError::InvalidKey { .. })), "{bad:?}");
            assert!(matches!(s.delete(bad), Err(ObjectError::InvalidKey { .. })), "{bad:?}");
        }
        for good in ["a", "a.b/c..d/.e", "x/ü/日本", &"a".repeat(255)] {
            s.put(good, b"x", PutCondition::Overwrite).unwrap();
        }
        let keys: Vec<String> = s.list("").unwrap().into_iter().map(|m| m.key).collect();
        assert!(!keys.iter().any(|k| k.starts_with('.')), "internals are not listed: {keys:?}");
    }

    #[test]
    fn a_key_cannot_be_both_an_object_and_a_folder() {
        let (_dir, s) = store();
        s.put("a/b", b"x", PutCondition::Overwrite).unwrap();
        for cond in [PutCondition::Overwrite, PutCondition::CreateOnly] {
            let err = s.put("a", b"y", cond).unwrap_err();
            assert!(matches!(err, ObjectError::InvalidKey { reason: COLLISION, .. }), "{err}");
        }
        let err = s.put("a/b/c", b"y", PutCondition::Overwrite).unwrap_err();
        assert!(matches!(err, ObjectError::InvalidKey { reason: COLLISION, .. }), "{err}");
        assert_eq!(s.get("a/b").unwrap(), b"x");
    }

    #[test]
    fn etags_change_with_every_write() {
        let (_dir, s) = store();
        let a = s.put("k", b"same", PutCondition::Overwrite).unwrap();
        let b = s.put("k", b"same", PutCondition::Overwrite).unwrap();
        assert_ne!(a.etag, b.etag);
        assert_eq!(s.head("k").unwrap().unwrap().etag, b.etag);
    }

    #[test]
    fn create_only_and_if_match() {
        let (_dir, s) = store();
        let first = s.put("r", b"first", PutCondition::CreateOnly).unwrap();
        assert!(matches!(s.put("r", b"second", PutCondition::CreateOnly), Err(ObjectError::AlreadyExists { .. })));
        assert_eq!(s.get("r").unwrap(), b"first");

        let second = s.put("r", b"second", PutCondition::IfMatch(first.etag.clone())).unwrap();
        let stale = s.put("r", b"third", PutCondition::IfMatch(first.etag.clone()));
        assert!(matches!(stale, Err(ObjectError::PreconditionFailed { .. })), "{stale:?}");
        assert_eq!(s.get("r").unwrap(), b"second");
        assert!(matches!(
            s.put("missing", b"x", PutCondition::IfMatch(second.etag.clone())),
            Err(ObjectError::NotFound { .. })
        ));
        // Writers check at the start and again at commit.
        assert!(matches!(s.writer("r", PutCondition::CreateOnly), Err(ObjectError::AlreadyExists { .. })));
        let mut w = s.writer("r", PutCondition::IfMatch(second.etag.clone())).unwrap();
        w.write_all(b"from writer").unwrap();
        s.put("r", b"sneaked in", PutCondition::Overwrite).unwrap();
        assert!(matches!(w.commit(), Err(ObjectError::PreconditionFailed { .. })));
        assert_eq!(s.get("r").unwrap(), b"sneaked in");
        assert_eq!(temp_count(&s), 0, "failed commits leave no temporary file");
    }

    #[test]
    fn if_match_is_a_compare_and_swap_under_contention() {
        let (_dir, s) = store();
        s.put("counter", b"0", PutCondition::Overwrite).unwrap();
        let threads = 8;
        let per_thread = 25;
        let barrier = Arc::new(Barrier::new(threads));
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                // A second handle on the same directory, as another process would have.
                let s = DirObjectStore::open(s.root()).unwrap();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    let mut done = 0;
                    while done < per_thread {
                        let meta = s.head("counter").unwrap().unwrap();
                        let Ok(bytes) = s.get("counter") else { continue };
                        let n: u64 = String::from_utf8(bytes).unwrap().parse().unwrap();
                        // The value read may be newer than the etag: then the swap must fail.
                        match s.put("counter", (n + 1).to_string().as_bytes(), PutCondition::IfMatch(meta.etag)) {
                            Ok(_) => done += 1,
                            Err(ObjectError::PreconditionFailed { .. }) => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        // Lost updates would leave the counter short. (Reading `get` after `head` can pair a
        // newer value with an older etag; the swap then fails, so no update is lost.)
        assert_eq!(s.get("counter").unwrap(), (threads * per_thread).to_string().as_bytes());
    }

    #[test]
    fn create_only_has_exactly_one_winner() {
        let (_dir, s) = store();
        for round in 0..20 {
            let key = format!("jobs/j{round}/receipt.cose");
            let threads = 8;
            let barrier = Arc::new(Barrier::new(threads));
            let handles: Vec<_> = (0..threads)
                .map(|i| {
                    let s = DirObjectStore::open(s.root()).unwrap();
                    let (barrier, key) = (barrier.clone(), key.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        match s.put(&key, format!("attempt {i}").as_bytes(), PutCondition::CreateOnly) {
                            Ok(_) => Some(i),
                            Err(ObjectError::AlreadyExists { .. }) => None,
                            Err(e) => panic!("{e}"),
                        }
                    })
                })
                .collect();
            let winners: Vec<usize> = handles.into_iter().filter_map(|h| h.join().unwrap()).collect();
            assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
            assert_eq!(s.get(&key).unwrap(), format!("attempt {}", winners[0]).as_bytes());
        }
    }

    #[test]
    fn readers_see_whole_versions_only() {
        let (_dir, s) = store();
        let size = 256 * 1024;
        s.put("big", &vec![b'a'; size], PutCondition::Overwrite).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (s, stop) = (s.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u8;
                while !stop.load(Ordering::Relaxed) {
                    let fill = b'a' + n % 26;
                    let mut w = s.writer("big", PutCondition::Overwrite).unwrap();
                    for chunk in vec![fill; size].chunks(10_000) {
                        w.write_all(chunk).unwrap();
                    }
                    w.commit().unwrap();
                    n = n.wrapping_add(1);
                }
            })
        };
        for _ in 0..200 {
            let bytes = s.get("big").unwrap();
            assert_eq!(bytes.len(), size);
            assert!(bytes.iter().all(|b| *b == bytes[0]), "a read mixed two versions");
            let mut streamed = Vec::new();
            let mut r = s.reader("big").unwrap();
            let mut buf = [0u8; 4096];
            loop {
                let n = r.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                streamed.extend_from_slice(&buf[..n]);
                std::thread::yield_now();
            }
            assert_eq!(streamed.len(), size);
            assert!(streamed.iter().all(|b| *b == streamed[0]), "a streamed read mixed two versions");
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
    }

    #[test]
    fn an_uncommitted_writer_leaves_nothing() {
        let (_dir, s) = store();
        let mut w = s.writer("jobs/x/output", PutCondition::CreateOnly).unwrap();
        w.write_all(&[7; 100_000]).unwrap();
        w.flush().unwrap();
        assert_eq!(s.head("jobs/x/output").unwrap(), None, "nothing visible before commit");
        assert_eq!(temp_count(&s), 1);
        drop(w);
        assert_eq!(s.head("jobs/x/output").unwrap(), None);
        assert_eq!(temp_count(&s), 0);
        assert!(s.list("").unwrap().is_empty());

        let mut w = s.writer("jobs/x/output", PutCondition::CreateOnly).unwrap();
        w.write_all(b"done").unwrap();
        let meta = w.commit().unwrap();
        assert_eq!(meta.size, 4);
        assert_eq!(s.get("jobs/x/output").unwrap(), b"done");
        assert_eq!(temp_count(&s), 0);
    }

    #[test]
    fn open_removes_stale_temporary_files_only() {
        let (_dir, s) = store();
        let tmp = s.root().join(TEMP_DIR);
        let stale = tmp.join("stale");
        let fresh = tmp.join("fresh");
        fs::write(&stale, b"x").unwrap();
        fs::write(&fresh, b"x").unwrap();
        let old = SystemTime::now() - STALE_TEMP_AGE - Duration::from_secs(60);
        File::options().write(true).open(&stale).unwrap().set_modified(old).unwrap();
        DirObjectStore::open(s.root()).unwrap();
        assert!(!stale.exists());
        assert!(fresh.exists(), "a writer in another process may still own it");
    }

    #[test]
    fn created_hook_fires_for_matching_keys_only() {
        let (_dir, s) = store();
        let seen = Arc::new(Mutex::new(Vec::<ObjectMeta>::new()));
        let hook: CreatedHook = {
            let seen = seen.clone();
            Arc::new(move |meta: &ObjectMeta| {
                seen.lock().unwrap().push(meta.clone());
                Ok(())
            })
        };
        s.set_created_hook("jobs/", "/input.sealed", hook);
        let a = s.put("jobs/a/input.sealed", b"1", PutCondition::CreateOnly).unwrap();
        s.put("jobs/a/status.json", b"2", PutCondition::Overwrite).unwrap();
        s.put("other/b/input.sealed", b"3", PutCondition::Overwrite).unwrap();
        s.put("jobs/a/input.sealed", b"dup", PutCondition::CreateOnly).unwrap_err(); // failed write: no event
        let mut w = s.writer("jobs/c/input.sealed", PutCondition::CreateOnly).unwrap();
        w.write_all(b"streamed").unwrap();
        let c = w.commit().unwrap();
        drop(s.writer("jobs/d/input.sealed", PutCondition::CreateOnly).unwrap()); // abandoned: no event
        assert_eq!(*seen.lock().unwrap(), vec![a, c]);

        s.clear_created_hook("jobs/", "/input.sealed");
        s.put("jobs/e/input.sealed", b"5", PutCondition::CreateOnly).unwrap();
        assert_eq!(seen.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_failing_hook_is_retried_and_the_write_stands() {
        let (_dir, s) = store();
        let calls = Arc::new(AtomicUsize::new(0));
        let flaky: CreatedHook = {
            let calls = calls.clone();
            Arc::new(move |_: &ObjectMeta| {
                if calls.fetch_add(1, Ordering::SeqCst) < 2 { Err("queue busy".into()) } else { Ok(()) }
            })
        };
        s.set_created_hook("", "", flaky);
        s.put("k", b"x", PutCondition::Overwrite).unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 3, "two failures, then success");

        calls.store(0, Ordering::SeqCst);
        let broken: CreatedHook = {
            let calls = calls.clone();
            Arc::new(move |_: &ObjectMeta| {
                calls.fetch_add(1, Ordering::SeqCst);
                Err("down".into())
            })
        };
        s.set_created_hook("", "", broken); // replaces the flaky one
        s.put("k2", b"y", PutCondition::Overwrite).unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), HOOK_RETRY_DELAYS.len() + 1);
        assert_eq!(s.get("k2").unwrap(), b"y");
    }

    fn temp_count(s: &DirObjectStore) -> usize {
        fs::read_dir(s.root().join(TEMP_DIR)).unwrap().count()
    }
}
