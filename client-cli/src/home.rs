//! `$EPHEM_HOME` (default `./.ephem`): where the embedded default keeps its state, and where the
//! client keeps its keys and what it remembers about its jobs.
//!
//! ```text
//! objects/ queues.sqlite kms.sqlite   the local cloud (cloud_local)
//! enclave/                            the enclave worker's state (development CA: dev-root.pem)
//! ledger/                             the receipts ledger (ledger.sqlite, ledger.key, ledger.pub)
//! run/                                pid files and the worker socket
//! logs/                               one log per background process
//! dev/                                development image publisher key and signed policy
//! client/result.key                   the client's X25519 result key (0600)
//! client/jobs/<id>/                   per job: job.json, commitment.key (0600), local-errors.jsonl
//! client/bulks/<bulk_id>/bulk.json    per bulk submission: its shards (each a job above)
//! models/                             model files installed by scripts/setup-model.sh
//! ```

use std::path::{Path, PathBuf};

use anyhow::Context;

#[derive(Debug, Clone)]
pub struct Home {
    root: PathBuf,
}

impl Home {
    /// `--home`, else `$EPHEM_HOME`, else `./.ephem`; made absolute so child processes agree.
    pub fn resolve(flag: Option<&Path>) -> anyhow::Result<Home> {
        let root = match flag {
            Some(path) => path.to_path_buf(),
            None => std::env::var_os("EPHEM_HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(".ephem")),
        };
        std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        let root = std::fs::canonicalize(&root).with_context(|| format!("resolving {}", root.display()))?;
        Ok(Home { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    pub fn run_dir(&self) -> PathBuf {
        self.dir("run")
    }

    /// Where the local stack records its Oblivious HTTP relay's URL while its host-poller runs.
    pub fn local_relay_url_file(&self) -> PathBuf {
        self.run_dir().join("online-relay.url")
    }

    /// The local stack's relay (`http://127.0.0.1:PORT/v1/ohttp`), while its host-poller runs:
    /// where `serve` sends encapsulated requests by default.
    pub fn local_relay_url(&self) -> Option<String> {
        self.running("host-poller")?;
        let text = std::fs::read_to_string(self.local_relay_url_file()).ok()?;
        Some(text.trim().to_owned()).filter(|url| url.starts_with("http://127.0.0.1:"))
    }

    pub fn logs_dir(&self) -> PathBuf {
        self.dir("logs")
    }

    pub fn enclave_dir(&self) -> PathBuf {
        self.dir("enclave")
    }

    pub fn ledger_dir(&self) -> PathBuf {
        self.dir("ledger")
    }

    pub fn dev_dir(&self) -> PathBuf {
        self.dir("dev")
    }

    pub fn dev_root_pem(&self) -> PathBuf {
        self.enclave_dir().join("dev-root.pem")
    }

    pub fn dev_policy(&self) -> PathBuf {
        self.dev_dir().join("policy.json")
    }

    pub fn dev_image_publisher_key(&self) -> PathBuf {
        self.dev_dir().join("image-publisher.key")
    }

    pub fn dev_image_publisher_pub(&self) -> PathBuf {
        self.dev_dir().join("image-publisher.pub")
    }

    pub fn result_key(&self) -> PathBuf {
        self.dir("client").join("result.key")
    }

    pub fn job_dir(&self, job_id: &str) -> PathBuf {
        self.dir("client").join("jobs").join(job_id)
    }

    pub fn bulk_dir(&self, bulk_id: &str) -> PathBuf {
        self.dir("client").join("bulks").join(bulk_id)
    }

    pub fn pid_file(&self, process: &str) -> PathBuf {
        self.run_dir().join(format!("{process}.pid"))
    }

    /// The pid in `run/<process>.pid` if that process is alive and is `process`.
    pub fn running(&self, process: &str) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.pid_file(process)).ok()?.trim().parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // A zombie is not running.
        let state = stat.rsplit(')').next()?.split_whitespace().next()?;
        (state != "Z" && String::from_utf8_lossy(&cmdline).contains(process)).then_some(pid)
    }

    pub fn log_file(&self, process: &str) -> PathBuf {
        self.logs_dir().join(format!("{process}.log"))
    }

    pub fn default_model_dir(&self) -> PathBuf {
        self.dir("models").join("all-MiniLM-L6-v2")
    }
}

/// Why a private file (a key, a job's secrets) was not used: each check by name, with the path,
/// as ssh names a private key it refuses. A key file another account could have written is not
/// this user's key: results sealed to it, or cancels signed with it, would be that account's.
#[derive(Debug, thiserror::Error)]
pub enum PrivateFileError {
    #[error("private file {}: is a symbolic link (a key is read only from the regular file its own name names; remove the link)", path.display())]
    Symlink { path: PathBuf },
    #[error("private file {}: is not a regular file but a {kind}", path.display())]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("private file {}: owned by uid {owner}, not by this user (uid {user}): another account could have put it there", path.display())]
    NotOwned { path: PathBuf, owner: u32, user: u32 },
    #[error("private file {}: mode {mode:o} lets group or others read or replace it (chmod 600 it)", path.display())]
    Mode { path: PathBuf, mode: u32 },
    #[error("private file {}: larger than {MAX_PRIVATE_FILE} bytes, not a file the client wrote", path.display())]
    TooLarge { path: PathBuf },
    #[error("private file {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

impl PrivateFileError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, PrivateFileError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

/// Keys and seeds are a few dozen bytes; anything this large was put there by someone else.
const MAX_PRIVATE_FILE: u64 = 64 * 1024;

/// Reads a private file after checking, on the descriptor it reads from (no window for a swap
/// between check and read), that it is not a link, is a regular file, is this user's and is
/// closed to group and others.
pub fn read_private(path: &Path) -> Result<zeroize::Zeroizing<Vec<u8>>, PrivateFileError> {
    read_own(path, 0o077).map(|(bytes, _)| bytes)
}

/// Like [`read_private`], refusing only the mode bits in `forbidden` (a record others may read
/// but nobody else may have written); returns the file's mode beside its bytes.
pub fn read_own(path: &Path, forbidden: u32) -> Result<(zeroize::Zeroizing<Vec<u8>>, u32), PrivateFileError> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let io = |source| PrivateFileError::Io { path: path.to_owned(), source };
    // O_NONBLOCK: opening a FIFO planted under the file's name must not wait for a writer.
    let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY;
    let file = match std::fs::OpenOptions::new().read(true).custom_flags(flags.bits() as i32).open(path) {
        Ok(file) => file,
        Err(error) if error.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
            return Err(PrivateFileError::Symlink { path: path.to_owned() });
        }
        Err(error) => return Err(io(error)),
    };
    let meta = file.metadata().map_err(io)?;
    check_metadata(path, &meta, rustix::process::geteuid().as_raw(), forbidden)?;
    let mut bytes = zeroize::Zeroizing::new(Vec::new());
    file.take(MAX_PRIVATE_FILE + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > MAX_PRIVATE_FILE {
        return Err(PrivateFileError::TooLarge { path: path.to_owned() });
    }
    Ok((bytes, meta.mode() & 0o7777))
}

/// The checks of [`read_private`] on a file's metadata, for the user `user` (an effective uid).
pub fn check_private_metadata(path: &Path, meta: &std::fs::Metadata, user: u32) -> Result<(), PrivateFileError> {
    check_metadata(path, meta, user, 0o077)
}

fn check_metadata(path: &Path, meta: &std::fs::Metadata, user: u32, forbidden: u32) -> Result<(), PrivateFileError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let kind = meta.file_type();
    if kind.is_symlink() {
        return Err(PrivateFileError::Symlink { path: path.to_owned() });
    }
    if !kind.is_file() {
        let kind = match () {
            _ if kind.is_dir() => "directory",
            _ if kind.is_fifo() => "FIFO",
            _ if kind.is_socket() => "socket",
            _ if kind.is_char_device() => "character device",
            _ if kind.is_block_device() => "block device",
            _ => "special file",
        };
        return Err(PrivateFileError::NotRegular { path: path.to_owned(), kind });
    }
    if meta.uid() != user {
        return Err(PrivateFileError::NotOwned { path: path.to_owned(), owner: meta.uid(), user });
    }
    let mode = meta.mode() & 0o7777;
    if mode & forbidden != 0 {
        return Err(PrivateFileError::Mode { path: path.to_owned(), mode });
    }
    Ok(())
}

/// Creates `dir` and its missing parents as 0700 (what the client keeps there is its own).
pub fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).with_context(|| format!("creating {}", dir.display()))
}

/// Writes a file only its owner can read (keys), replacing any file of that name.
pub fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = write_private_temp(path, bytes)?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display())).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    sync_parent(path)
}

/// Creates `path` (mode 0600) holding `bytes` unless it exists: written under a temporary name
/// of its own, then hard-linked into place, so of two processes creating it at once one wins
/// and the other finds the winner's whole file. `false`: it existed, nothing was written.
pub fn create_private(path: &Path, bytes: &[u8]) -> anyhow::Result<bool> {
    let tmp = write_private_temp(path, bytes)?;
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => sync_parent(path).map(|()| true),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(error) => Err(error).with_context(|| format!("creating {}", path.display())),
    }
}

/// Makes a rename or link into `path`'s directory durable (the file's own bytes are synced
/// before): a crash right after must not lose the name.
fn sync_parent(path: &Path) -> anyhow::Result<()> {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::File::open(parent).and_then(|dir| dir.sync_all()).with_context(|| format!("syncing {}", parent.display()))
}

/// `bytes`, synced, in a 0600 file beside `path` under a name no other writer uses (a shared
/// temporary name would let concurrent writers rename each other's half-written files),
/// created exclusively and never through a link planted under that name.
fn write_private_temp(path: &Path, bytes: &[u8]) -> anyhow::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_private_dir(parent)?;
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let unique = format!("{}.{}", std::process::id(), COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let tmp = path.with_file_name(format!(".{name}.{unique}.tmp"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    if let Err(error) = file.write_all(bytes).and_then(|()| file.sync_all()) {
        let _ = std::fs::remove_file(&tmp);
        return Err(error).with_context(|| format!("writing {}", tmp.display()));
    }
    Ok(tmp)
}
