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

    let pool = RsaKeyPool::start(2);
    let deadline = Instant::now() + Duration::from_secs(120);
    while pool.ready() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(pool.ready(), 2);
    let started = Instant::now();
    let _key = pool.take().unwrap();
    let take = started.elapsed();
    println!("warm pool take: {:.3} ms", ms(&take));
    assert!(take < Duration::from_millis(50), "a ready key is handed out at once ({take:?})");
}
