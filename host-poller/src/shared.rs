//! State the poller's threads share: shutdown (graceful, then hard), the worker's generation
//! (bumped whenever the worker process is replaced) and readiness, requests for a control
//! re-scan, the models the worker holds and the loads jobs wait for, and the open worker
//! connections (so a shutdown can cut them).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::worker_link::WorkerLink;

#[derive(Default)]
struct WorkerState {
    /// Changes whenever the worker may have been replaced; control reconnects and sets it up.
    generation: u64,
    /// The worker reported a fleet key and a model in use (for this generation).
    ready: bool,
    /// A job hit a missing key or model: look at the stores again now.
    rescan: bool,
    /// Control's view of the models the worker holds: model directory → manifest key.
    loaded: BTreeMap<String, String>,
    /// Manifest keys jobs wait for control to load (evicting if it must).
    demanded: BTreeSet<String>,
    /// Demanded manifests the worker refused (until demanded again).
    refused: BTreeSet<String>,
}

#[derive(Default)]
pub(crate) struct Shared {
    stop: AtomicBool,
    abort: AtomicBool,
    worker: Mutex<WorkerState>,
    changed: Condvar,
    inflight: Mutex<HashMap<u64, WorkerLink>>,
    next_inflight: AtomicU64,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, WorkerState> {
        self.worker.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _guard = self.state();
        self.changed.notify_all();
    }

    /// Stops and cuts every job connection in flight.
    pub fn abort(&self) {
        self.abort.store(true, Ordering::SeqCst);
        self.stop();
        self.cut_links();
    }

    /// Shuts down every tracked connection: whoever is blocked on one wakes with an error.
    pub fn cut_links(&self) {
        for link in self.inflight.lock().unwrap_or_else(|p| p.into_inner()).values() {
            link.shutdown();
        }
    }

    pub fn is_stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    pub fn is_aborting(&self) -> bool {
        self.abort.load(Ordering::SeqCst)
    }

    /// Sleeps up to `duration`, less if the poller stops.
    pub fn sleep(&self, duration: Duration) {
        let deadline = Instant::now() + duration;
        let mut state = self.state();
        while !self.is_stopping() {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { break };
            state = self.changed.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    pub fn generation(&self) -> u64 {
        self.state().generation
    }

    /// The worker process was (or may have been) replaced.
    pub fn worker_replaced(&self) {
        let mut state = self.state();
        state.generation += 1;
        state.ready = false;
        self.changed.notify_all();
    }

    /// Control's verdict for the worker of `generation`.
    pub fn set_ready(&self, generation: u64, ready: bool) {
        let mut state = self.state();
        if state.generation == generation && state.ready != ready {
            state.ready = ready;
            self.changed.notify_all();
        }
    }

    /// Waits up to `timeout` for the worker to be ready; false if it is not (or the poller stops).
    pub fn wait_ready(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.state();
        loop {
            if state.ready {
                return true;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { return false };
            if self.is_stopping() {
                return false;
            }
            state = self.changed.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    pub fn request_rescan(&self) {
        let mut state = self.state();
        state.rescan = true;
        self.changed.notify_all();
    }

    /// Control's view of what the worker holds (model directory → manifest key), after every change.
    pub fn set_loaded(&self, loaded: &BTreeMap<String, String>) {
        let mut state = self.state();
        state.loaded.clone_from(loaded);
        self.changed.notify_all();
    }

    /// The manifest key the worker holds for a model directory, in control's view.
    pub fn loaded(&self, dir: &str) -> Option<String> {
        self.state().loaded.get(dir).cloned()
    }

    /// Asks control to load `manifest_key` (evicting least recently used models if it must) and
    /// waits up to `timeout` for it: true once the worker holds it, false if it refused or time ran out.
    pub fn demand_model(&self, dir: &str, manifest_key: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.state();
        // A new demand is a new try: a refusal before it is not its answer.
        state.refused.remove(manifest_key);
        state.demanded.insert(manifest_key.to_owned());
        self.changed.notify_all();
        loop {
            if state.loaded.get(dir).is_some_and(|k| k == manifest_key) {
                return true;
            }
            if state.refused.contains(manifest_key) || self.is_stopping() {
                return false;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                state.demanded.remove(manifest_key);
                return false;
            };
            state = self.changed.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// The loads jobs wait for, taken by control.
    pub fn take_demands(&self) -> Vec<String> {
        std::mem::take(&mut self.state().demanded).into_iter().collect()
    }

    /// Control could not load a demanded manifest: its waiters stop waiting.
    pub fn demand_refused(&self, manifest_key: &str) {
        let mut state = self.state();
        state.refused.insert(manifest_key.to_owned());
        self.changed.notify_all();
    }

    /// Control's idle wait: returns when `timeout` passes, a re-scan or a model load is requested,
    /// the worker's generation moves past `seen`, or the poller stops. True if a re-scan was requested.
    pub fn wait_for_control(&self, seen: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.state();
        loop {
            if state.rescan {
                state.rescan = false;
                return true;
            }
            if !state.demanded.is_empty() {
                return false;
            }
            if state.generation != seen || self.is_stopping() {
                return false;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { return false };
            state = self.changed.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Registers a connection so that [`Shared::abort`] (and, for control, the end of a
    /// graceful stop) can cut it; unregistered on drop.
    pub fn track(self: &Arc<Self>, link: WorkerLink) -> Inflight {
        let id = self.next_inflight.fetch_add(1, Ordering::SeqCst);
        let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_aborting() {
            link.shutdown();
        }
        inflight.insert(id, link);
        Inflight { shared: Arc::clone(self), id }
    }
}

pub(crate) struct Inflight {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.shared.inflight.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
    }
}

/// Stops a running [`crate::Poller`]: [`stop`](Self::stop) takes no new message and lets the jobs
/// in flight finish; [`abort`](Self::abort) also hands those back to the queue at once.
#[derive(Clone)]
pub struct ShutdownHandle {
    pub(crate) shared: Arc<Shared>,
}

impl ShutdownHandle {
    pub fn stop(&self) {
        self.shared.stop();
    }

    pub fn abort(&self) {
        self.shared.abort();
    }

    pub fn is_stopping(&self) -> bool {
        self.shared.is_stopping()
    }

    /// SIGTERM or SIGINT: the first stops gracefully, the second aborts.
    pub fn on_signals(&self) -> std::io::Result<()> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
        let handle = self.clone();
        std::thread::Builder::new().name("signals".into()).spawn(move || {
            let mut seen = 0;
            for signal in signals.forever() {
                seen += 1;
                if seen == 1 {
                    tracing::info!(signal, "stopping: no new jobs, finishing the ones in flight (signal again to release them)");
                    handle.stop();
                } else {
                    tracing::warn!(signal, "releasing the jobs in flight and exiting");
                    handle.abort();
                }
            }
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIR: &str = "models/b";
    const KEY: &str = "models/b/v1/manifest.cose";

    /// Control's side of a demand: takes it, then reports the load or the refusal.
    fn control(shared: Arc<Shared>, loaded: bool) -> std::thread::JoinHandle<Vec<String>> {
        std::thread::spawn(move || loop {
            let demands = shared.take_demands();
            if demands.is_empty() {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            for key in &demands {
                if loaded {
                    shared.set_loaded(&BTreeMap::from([(DIR.to_owned(), key.clone())]));
                } else {
                    shared.demand_refused(key);
                }
            }
            return demands;
        })
    }

    #[test]
    fn a_job_waits_for_the_load_it_demanded() {
        let shared = Arc::new(Shared::default());
        let control = control(Arc::clone(&shared), true);
        assert!(shared.demand_model(DIR, KEY, Duration::from_secs(10)));
        assert_eq!(control.join().unwrap(), [KEY]);
        assert_eq!(shared.loaded(DIR).as_deref(), Some(KEY));
    }

    #[test]
    fn a_refused_load_ends_the_wait_and_a_new_demand_tries_again() {
        let shared = Arc::new(Shared::default());
        let control_thread = control(Arc::clone(&shared), false);
        assert!(!shared.demand_model(DIR, KEY, Duration::from_secs(10)));
        control_thread.join().unwrap();
        let control_thread = control(Arc::clone(&shared), true);
        assert!(shared.demand_model(DIR, KEY, Duration::from_secs(10)), "the old refusal is not this demand's answer");
        control_thread.join().unwrap();
    }

    #[test]
    fn an_unanswered_demand_times_out_and_is_withdrawn() {
        let shared = Shared::default();
        assert!(!shared.demand_model(DIR, KEY, Duration::from_millis(20)));
        assert!(shared.take_demands().is_empty());
    }
}
