//! `ephem-batch submit` on files that cannot be a corpus, run as a real process: one line
//! naming the file and what is wrong, a non-zero exit, and nothing reached before — the home
//! stays empty (no backend opened, no stack started or asked, no warning, no model chosen).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

/// Runs `submit <file>` against a fresh, empty home; exit code and stderr.
fn submit(file: &Path) -> (Option<i32>, String) {
    let home = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_ephem-batch"))
        .arg("--home")
        .arg(home.path())
        .arg("submit")
        .arg(file)
        .env_remove("EPHEM_HOME")
        .env_remove("EPHEM_BACKEND")
        .output()
        .expect("running ephem-batch");
    let left: Vec<_> = std::fs::read_dir(home.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "submit {} touched the home before refusing the file: {left:?}", file.display());
    assert!(output.stdout.is_empty(), "{}", String::from_utf8_lossy(&output.stdout));
    (output.status.code(), String::from_utf8(output.stderr).unwrap())
}

/// One line, the cause said once, a non-zero exit.
fn refused(file: &Path, says: &str) {
    let (code, stderr) = submit(file);
    assert!(code.is_some_and(|c| c != 0), "exit {code:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {stderr:?}");
    assert!(lines[0].starts_with("error: ") && lines[0].contains(says), "{:?} does not say {says:?}", lines[0]);
    assert!(lines[0].contains(&file.display().to_string()), "{:?} does not name {}", lines[0], file.display());
    assert!(lines[0].matches("os error").count() <= 1, "the cause repeated: {:?}", lines[0]);
}

#[test]
fn an_empty_corpus_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("empty.jsonl");
    std::fs::write(&file, "").unwrap();
    refused(&file, "is empty: a corpus needs at least one record, nothing was submitted");
}

#[test]
fn a_corpus_whose_every_line_is_refused_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.jsonl");
    std::fs::write(&file, "{\"id\": 1}\nnot json\n").unwrap();
    refused(&file, "holds no record: all 2 of its lines were refused");
}

#[test]
fn a_missing_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    refused(&dir.path().join("missing.jsonl"), "missing.jsonl: no such file");
}

#[test]
fn a_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    refused(dir.path(), "is a directory, not a corpus file");
}

/// A file without read permission. Root reads it all the same (CAP_DAC_OVERRIDE), so under
/// root this case cannot be made this way: the test says so and leaves it to the next one.
#[test]
fn a_file_without_read_permission_is_refused() {
    if euid_is_root() {
        eprintln!("skipped: running as root, which reads a mode-000 file; see a_file_whose_read_fails_is_refused");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret.jsonl");
    std::fs::write(&file, "{\"id\": 1, \"text\": \"a\"}\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o000)).unwrap();
    refused(&file, "cannot be read: Permission denied");
}

/// A regular file whose read fails for every user, root included: a process's own memory read
/// from address 0 (`/proc/self/mem`, EIO).
#[test]
fn a_file_whose_read_fails_is_refused() {
    let file = Path::new("/proc/self/mem");
    if !std::fs::metadata(file).is_ok_and(|m| m.is_file()) {
        eprintln!("skipped: {} is not a regular file on this system", file.display());
        return;
    }
    refused(file, "/proc/self/mem cannot be read: ");
}

fn euid_is_root() -> bool {
    // The owner of a file this process creates is its effective uid.
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("probe");
    std::fs::write(&probe, b"").unwrap();
    std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&probe).unwrap()) == 0
}
