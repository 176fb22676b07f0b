//! The stack's processes from the outside: liveness, real signals, memory (Linux `/proc`).

use std::time::{Duration, Instant};

/// The state letter of `pid` in `/proc/<pid>/stat` (`R`, `S`, `Z`, …), if it exists.
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().next()?.chars().next()
}

/// Whether `pid` is a live process (a zombie is not).
pub fn is_running(pid: u32) -> bool {
    state(pid).is_some_and(|s| s != 'Z' && s != 'X')
}

/// Sends `signal` (`KILL`, `STOP`, `CONT`, …) to `pid`, by the system call itself: a test
/// that signals the moment it sees something happen must not give the process the time a
/// `kill` child takes to start.
pub fn signal(pid: u32, signal: &str) {
    use rustix::process::{kill_process, Pid, Signal};
    let sig = match signal {
        "KILL" => Signal::KILL,
        "STOP" => Signal::STOP,
        "CONT" => Signal::CONT,
        "TERM" => Signal::TERM,
        "INT" => Signal::INT,
        "HUP" => Signal::HUP,
        other => panic!("signal {other} is not one the tests send"),
    };
    let target = Pid::from_raw(pid as i32).expect("a process id");
    kill_process(target, sig).unwrap_or_else(|e| panic!("kill -{signal} {pid}: {e}"));
}

/// SIGKILL, then waits (up to 10 s) until the process is gone.
pub fn kill9(pid: u32) {
    signal(pid, "KILL");
    let deadline = Instant::now() + Duration::from_secs(10);
    while is_running(pid) {
        assert!(Instant::now() < deadline, "pid {pid} still runs 10 s after SIGKILL");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A value in kB from `/proc/<pid>/status` (`VmHWM`: peak resident set; `VmRSS`).
pub fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?;
    line[field.len() + 1..].trim().trim_end_matches("kB").trim().parse().ok()
}

/// A variable of `pid`'s environment as it was started (`/proc/<pid>/environ`).
pub fn environment_variable(pid: u32, name: &str) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ.split(|b| *b == 0).find_map(|entry| {
        let entry = String::from_utf8_lossy(entry);
        entry.strip_prefix(name).and_then(|rest| rest.strip_prefix('=')).map(str::to_owned)
    })
}
