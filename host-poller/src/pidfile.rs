//! `run/<name>.pid` files, as `ephem-batch dev up|down|status` reads them: one decimal pid and a
//! newline, written atomically, removed on a clean exit by whoever wrote them.

use std::io;
use std::path::{Path, PathBuf};

pub(crate) struct PidFile {
    path: PathBuf,
    pid: u32,
}

impl PidFile {
    pub fn write(path: &Path, pid: u32) -> io::Result<PidFile> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("pid.tmp");
        std::fs::write(&tmp, format!("{pid}\n"))?;
        std::fs::rename(&tmp, path)?;
        Ok(PidFile { path: path.to_owned(), pid })
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        // Only our own: a successor may have written its pid meanwhile.
        if read(&self.path) == Some(self.pid) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

pub(crate) fn read(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The command line of a live process (Linux `/proc`), if there is one with this pid.
pub(crate) fn command_line(pid: u32) -> Option<String> {
    let bytes = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&bytes).replace('\0', " ").trim().to_owned())
}

/// The pid in `path` if that process is alive and its command line mentions `name` (so a
/// recycled pid of an unrelated process does not count).
pub(crate) fn running(path: &Path, name: &str) -> Option<u32> {
    let pid = read(path)?;
    command_line(pid).filter(|line| line.contains(name)).map(|_| pid)
}
