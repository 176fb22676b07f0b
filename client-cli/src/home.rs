//! `$EPHEM_HOME` (default `./.ephem`): where the embedded default keeps its state, and where the
//! client keeps its keys and what it remembers about its jobs.
//!
//! ```text
//! objects/ queues.sqlite kms.sqlite   the local cloud (cloud::local)
//! enclave/                            the enclave worker's state (development CA: dev-root.pem)
//! ledger/                             the receipts ledger (ledger.sqlite, ledger.key, ledger.pub)
//! run/                                pid files and the worker socket
//! logs/                               one log per background process
//! dev/                                development image publisher key and signed policy
//! client/result.key                   the client's X25519 result key (0600)
//! client/jobs/<id>/                   per job: job.json, commitment.key, local-errors.jsonl
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

    pub fn log_file(&self, process: &str) -> PathBuf {
        self.logs_dir().join(format!("{process}.log"))
    }

    pub fn default_model_dir(&self) -> PathBuf {
        self.dir("models").join("all-MiniLM-L6-v2")
    }
}

/// Writes a file only its owner can read (keys).
pub fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = write_private_temp(path, bytes)?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display())).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Creates `path` (mode 0600) holding `bytes` unless it exists: written under a temporary name
/// of its own, then hard-linked into place, so of two processes creating it at once one wins
/// and the other finds the winner's whole file. `false`: it existed, nothing was written.
pub fn create_private(path: &Path, bytes: &[u8]) -> anyhow::Result<bool> {
    let tmp = write_private_temp(path, bytes)?;
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(error) => Err(error).with_context(|| format!("creating {}", path.display())),
    }
}

/// `bytes`, synced, in a 0600 file beside `path` under a name no other writer uses (a shared
/// temporary name would let concurrent writers rename each other's half-written files).
fn write_private_temp(path: &Path, bytes: &[u8]) -> anyhow::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let unique = format!("{}.{}", std::process::id(), COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let tmp = path.with_file_name(format!(".{name}.{unique}.tmp"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    if let Err(error) = file.write_all(bytes).and_then(|()| file.sync_all()) {
        let _ = std::fs::remove_file(&tmp);
        return Err(error).with_context(|| format!("writing {}", tmp.display()));
    }
    Ok(tmp)
}
