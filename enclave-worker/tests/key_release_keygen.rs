//! RSA-2048 one-shot key generation: how long it takes (median of 10, printed; run with
//! `--nocapture` to see it), and that a warmed-up pool hands a key out without waiting.

use std::time::{Duration, Instant};

use enclave_worker::key_release::{OneShotKey, RsaKeyPool};

#[test]
fn rsa_2048_keygen_time_and_pool_latency() {
    let mut times: Vec<Duration> = (0..10)
        .map(|_| {
            let started = Instant::now();
            let key = OneShotKey::generate().unwrap();
            let elapsed = started.elapsed();
            assert_eq!(key.public_key_der().len(), 294);
            elapsed
        })
        .collect();
    times.sort();
    let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    let median = (ms(&times[4]) + ms(&times[5])) / 2.0;
    let all: Vec<String> = times.iter().map(|d| format!("{:.0}", ms(d))).collect();
    println!(
        "RSA-2048 keygen over 10 keys: median {median:.0} ms, min {:.0} ms, max {:.0} ms (sorted: {} ms)",
        ms(&times[0]),
        ms(&times[9]),
        all.join(", ")
    );

    let pool = RsaKeyPool::start(2, 1);
    wait_for(|| pool.ready() == 2, "two keys ready");
    let started = Instant::now();
    let _key = pool.take().unwrap();
    let take = started.elapsed();
    println!("warm pool take: {:.3} ms", ms(&take));
    assert!(take < Duration::from_millis(50), "a ready key is handed out at once ({take:?})");

    // Two generators: one makes its first key at the process's priority, every other key is
    // made at nice 10 (Linux keeps a nice value per thread; the test's own thread stays at 0).
    drop(pool);
    wait_for(|| generator_nice_values().is_empty(), "the dropped pool's generator stops");
    let pool = RsaKeyPool::start(2, 2);
    wait_for(|| pool.ready() == 2, "two keys ready");
    assert_eq!(generator_nice_values(), [0, 10], "the first key at full priority, the second generator's at 10");
    // Two takes: whichever generator was first in line, each has handed out a key (a generator
    // waiting in `send` is served before one that arrives after it).
    let _keys = [pool.take().unwrap(), pool.take().unwrap()];
    wait_for(|| pool.ready() == 2, "the pool refilled");
    assert_eq!(generator_nice_values(), [10, 10], "refills at nice 10");
    assert_eq!(read_nice("self"), Some(0));
}

fn wait_for(condition: impl Fn() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The nice values of this process's key generator threads, sorted. A thread that exits while
/// it is being read (a dropped pool's generator) is not counted: its `/proc` entries vanish.
fn generator_nice_values() -> Vec<i64> {
    let mut values: Vec<i64> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|tid| std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).is_ok_and(|comm| comm.trim() == "one-shot-rsa"))
        .filter_map(|tid| read_nice(&format!("self/task/{tid}")))
        .collect();
    values.sort();
    values
}

/// Field 19 of `/proc/<path>/stat`, counted after the parenthesised command name; `None` when
/// the task is gone.
fn read_nice(path: &str) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{path}/stat")).ok()?;
    Some(stat[stat.rfind(')').unwrap() + 2..].split(' ').nth(16).unwrap().parse().unwrap())
}
