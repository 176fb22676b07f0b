//! The pool's threads kept awake for one call. A rayon thread that finds no work yields a few
//! dozen times and then sleeps on a futex; the next fork wakes it, and under a hypervisor that
//! wake-up costs tens of microseconds (a join of two 50 µs halves after 50 µs of serial work:
//! 114 µs at the median, 51 µs with the other thread awake; 2 threads, Emerald Rapids under KVM).
//! One text's forward pass forks a few hundred times between short serial steps, so during a
//! call every other thread polls for work instead, as ONNX Runtime's spinning pool does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A poller that finds no work for this long goes back to rayon's sleep. On a pool shared by
/// several callers a poller can be stacked above another call's job on its thread (taken while
/// that job waited in a join), which then cannot go on until the poller returns: it must not wait
/// for its own call's end there.
const IDLE_LIMIT: Duration = Duration::from_millis(1);

/// Runs `work` on this pool thread (inside `ThreadPool::install`) while the pool's other threads
/// poll for work until it returns (or unwinds).
pub(super) fn run<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    let caller = rayon::current_thread_index();
    let done = AtomicBool::new(false);
    rayon::in_place_scope(|scope| {
        scope.spawn_broadcast(|_, thread| {
            if Some(thread.index()) != caller {
                poll_until(&done);
            }
        });
        let _done = Done(&done);
        work()
    })
}

/// Sets its flag when dropped: the pollers stop as soon as the work returns or panics.
struct Done<'a>(&'a AtomicBool);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Runs the pool's jobs as they come until `done`, or until none has come for [`IDLE_LIMIT`].
fn poll_until(done: &AtomicBool) {
    let mut last_job = Instant::now();
    while !done.load(Ordering::Acquire) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => last_job = Instant::now(),
            _ if last_job.elapsed() > IDLE_LIMIT => return,
            _ => std::hint::spin_loop(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;
    use std::sync::mpsc;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap()
    }

    /// Forks the way a forward pass does: parallel sections between serial steps.
    fn forward_pass(seed: u64) -> u64 {
        (0..40u64).fold(seed, |acc, step| {
            let part: u64 = (0..64u64).into_par_iter().map(|i| (i ^ step).wrapping_mul(acc | 1) % 1_000_003).sum();
            acc.wrapping_add(part)
        })
    }

    #[test]
    fn the_work_runs_and_returns_its_result() {
        let pool = pool(2);
        let want = forward_pass(7);
        assert_eq!(pool.install(|| run(|| forward_pass(7))), want);
        // The pollers let go at the end: the pool still runs plain work afterwards.
        assert_eq!(pool.install(|| forward_pass(7)), want);
    }

    /// Callers on a shared pool: one call's poller may be stacked on a thread that holds
    /// another call's work below it. Every call must still end (the idle limit lets go).
    #[test]
    fn concurrent_calls_on_a_shared_pool_all_end() {
        let pool = std::sync::Arc::new(pool(2));
        let (sent, received) = mpsc::channel();
        for caller in 0..4u64 {
            let (pool, sent) = (pool.clone(), sent.clone());
            std::thread::spawn(move || {
                for call in 0..50 {
                    let seed = caller * 1_000 + call;
                    let got = pool.install(|| run(|| forward_pass(seed)));
                    sent.send((seed, got)).unwrap();
                }
            });
        }
        for _ in 0..200 {
            let (seed, got) = received.recv_timeout(Duration::from_secs(60)).expect("a call never ended");
            assert_eq!(got, forward_pass(seed));
        }
    }

    #[test]
    fn a_panic_in_the_work_reaches_the_caller_and_frees_the_pool() {
        let pool = pool(2);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.install(|| run(|| -> u64 { panic!("forward pass failed") }))));
        assert!(outcome.is_err());
        assert_eq!(pool.install(|| run(|| forward_pass(3))), forward_pass(3));
    }
}
