//! The worker's model memory budget: the models it holds, each with the bytes its engine holds
//! and its last use, under one budget. Loading a model that does not fit evicts the least
//! recently used ones until it does — those no job or request is using first — (or, when the
//! host asks for a load only if it fits, is refused); a model larger than the whole budget is
//! refused by name.
//!
//! Eviction drops the worker's reference only: a job or online request that took the model
//! before keeps its `Arc` and finishes normally, and the model's memory is freed when the last
//! of them ends. Between those two moments the process holds more than the budget.

use std::collections::BTreeMap;
use std::sync::Arc;

/// What a held value's memory is, measured now (it may grow: lazily built precision copies).
pub trait Measured {
    fn memory_bytes(&self) -> u64;
}

/// Whether a load may evict other models to make room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// Evict the least recently used models until the new one fits.
    Evict,
    /// Refuse ([`MemoryError::WouldEvict`]) rather than evict anything.
    OnlyIfFits,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    /// The model alone needs more than the budget: it is never loaded.
    #[error("model {model_id} needs {bytes} bytes, more than the whole model memory budget of {budget} bytes")]
    OverBudget { model_id: String, bytes: u64, budget: u64 },
    /// The model fits the budget, but only after evicting others, which the request did not allow.
    #[error("model {model_id} needs {bytes} bytes; {free} of the {budget}-byte budget are free without evicting another model")]
    WouldEvict { model_id: String, bytes: u64, free: u64, budget: u64 },
}

/// One model the budget let go.
pub struct Evicted<T> {
    pub model_id: String,
    pub bytes: u64,
    /// The worker's last reference (dropping it frees the memory unless a job still holds one).
    pub value: Arc<T>,
}

/// A held model as reported: its id, bytes now, and last use.
pub struct Resident<T> {
    pub model_id: String,
    pub bytes: u64,
    pub last_use_ms: u64,
    pub value: Arc<T>,
}

struct Held<T> {
    value: Arc<T>,
    last_use_ms: u64,
    /// Order of last use (the clock's milliseconds can tie).
    used_at: u64,
}

/// The held models under one budget. Not synchronised: the worker keeps it behind a lock.
pub struct ModelMemory<T> {
    budget: u64,
    held: BTreeMap<String, Held<T>>,
    uses: u64,
}

impl<T: Measured> ModelMemory<T> {
    pub fn new(budget: u64) -> Self {
        Self { budget, held: BTreeMap::new(), uses: 0 }
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes the held models hold now.
    pub fn used(&self) -> u64 {
        self.held.values().map(|h| h.value.memory_bytes()).sum()
    }

    /// Whether a model of `bytes` could be loaded as `model_id` (replacing a held model of that id)
    /// without evicting another, or at all.
    pub fn check(&self, model_id: &str, bytes: u64, room: Room) -> Result<(), MemoryError> {
        if bytes > self.budget {
            return Err(MemoryError::OverBudget { model_id: model_id.to_owned(), bytes, budget: self.budget });
        }
        let others: u64 = self.held.iter().filter(|(id, _)| id.as_str() != model_id).map(|(_, h)| h.value.memory_bytes()).sum();
        let free = self.budget.saturating_sub(others);
        if room == Room::OnlyIfFits && bytes > free {
            return Err(MemoryError::WouldEvict { model_id: model_id.to_owned(), bytes, free, budget: self.budget });
        }
        Ok(())
    }

    /// Holds `value` as `model_id` (a held model of that id is replaced in place), evicting the
    /// least recently used others if `room` allows and it does not fit otherwise. Counts as a use.
    pub fn insert(&mut self, model_id: &str, value: Arc<T>, now_ms: u64, room: Room) -> Result<Vec<Evicted<T>>, MemoryError> {
        let bytes = value.memory_bytes();
        self.check(model_id, bytes, room)?;
        let mut evicted = Vec::new();
        loop {
            let others: u64 = self.held.iter().filter(|(id, _)| id.as_str() != model_id).map(|(_, h)| h.value.memory_bytes()).sum();
            if others + bytes <= self.budget {
                break;
            }
            // Models no job holds go first: evicting one a job holds frees nothing until it ends.
            let oldest = self
                .held
                .iter()
                .filter(|(id, _)| id.as_str() != model_id)
                .min_by_key(|(_, h)| (Arc::strong_count(&h.value) > 1, h.used_at))
                .map(|(id, _)| id.clone())
                .expect("others hold bytes, so there is another model");
            let held = self.held.remove(&oldest).expect("listed above");
            evicted.push(Evicted { bytes: held.value.memory_bytes(), model_id: oldest, value: held.value });
        }
        self.uses += 1;
        self.held.insert(model_id.to_owned(), Held { value, last_use_ms: now_ms, used_at: self.uses });
        Ok(evicted)
    }

    /// The model held as `model_id`, recording the use.
    pub fn take(&mut self, model_id: &str, now_ms: u64) -> Option<Arc<T>> {
        let held = self.held.get_mut(model_id)?;
        self.uses += 1;
        held.used_at = self.uses;
        held.last_use_ms = now_ms;
        Some(Arc::clone(&held.value))
    }

    pub fn ids(&self) -> Vec<String> {
        self.held.keys().cloned().collect()
    }

    /// Every held model, by id.
    pub fn residents(&self) -> Vec<Resident<T>> {
        self.held
            .iter()
            .map(|(id, h)| Resident {
                model_id: id.clone(),
                bytes: h.value.memory_bytes(),
                last_use_ms: h.last_use_ms,
                value: Arc::clone(&h.value),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A model stand-in: real bytes, whose measured size can grow as a lazily built copy does.
    struct Blob {
        data: Vec<u8>,
        extra: AtomicU64,
    }

    impl Measured for Blob {
        fn memory_bytes(&self) -> u64 {
            self.data.len() as u64 + self.extra.load(Ordering::Relaxed)
        }
    }

    fn blob(bytes: usize) -> Arc<Blob> {
        Arc::new(Blob { data: vec![7; bytes], extra: AtomicU64::new(0) })
    }

    fn ids<T>(evicted: &[Evicted<T>]) -> Vec<&str> {
        evicted.iter().map(|e| e.model_id.as_str()).collect()
    }

    #[test]
    fn models_that_fit_are_all_held() {
        let mut memory = ModelMemory::new(100);
        assert!(memory.insert("a", blob(40), 1, Room::OnlyIfFits).unwrap().is_empty());
        assert!(memory.insert("b", blob(60), 2, Room::OnlyIfFits).unwrap().is_empty());
        assert_eq!(memory.ids(), ["a", "b"]);
        assert_eq!(memory.used(), 100);
    }

    #[test]
    fn the_least_recently_used_model_is_evicted_first() {
        let mut memory = ModelMemory::new(100);
        memory.insert("a", blob(40), 1, Room::Evict).unwrap();
        memory.insert("b", blob(40), 2, Room::Evict).unwrap();
        // A job takes a, so b is now the least recently used.
        assert!(memory.take("a", 3).is_some());
        let evicted = memory.insert("c", blob(40), 4, Room::Evict).unwrap();
        assert_eq!(ids(&evicted), ["b"]);
        assert_eq!(memory.ids(), ["a", "c"]);
        // A big one evicts as many as it needs, oldest first.
        let evicted = memory.insert("d", blob(90), 5, Room::Evict).unwrap();
        assert_eq!(ids(&evicted), ["a", "c"]);
        assert_eq!(memory.ids(), ["d"]);
        assert!(memory.take("b", 6).is_none(), "an evicted model is not served");
    }

    #[test]
    fn a_model_in_use_is_evicted_after_the_idle_ones() {
        let mut memory = ModelMemory::new(100);
        memory.insert("a", blob(40), 1, Room::Evict).unwrap();
        memory.insert("b", blob(40), 2, Room::Evict).unwrap();
        // A job holds a, now the least recently used; b's request has ended: b goes instead.
        let job = memory.take("a", 3).unwrap();
        drop(memory.take("b", 4).unwrap());
        assert_eq!(ids(&memory.insert("c", blob(40), 5, Room::Evict).unwrap()), ["b"]);
        // When evicting every idle model is not enough, models in use go too.
        assert_eq!(ids(&memory.insert("d", blob(70), 6, Room::Evict).unwrap()), ["c", "a"]);
        assert_eq!(job.data.len(), 40);
    }

    #[test]
    fn a_load_only_if_it_fits_evicts_nothing() {
        let mut memory = ModelMemory::new(100);
        memory.insert("a", blob(70), 1, Room::Evict).unwrap();
        let refused = memory.insert("b", blob(40), 2, Room::OnlyIfFits).err().unwrap();
        assert_eq!(refused, MemoryError::WouldEvict { model_id: "b".into(), bytes: 40, free: 30, budget: 100 });
        assert_eq!(memory.ids(), ["a"], "nothing was evicted for it");
        assert_eq!(memory.check("b", 30, Room::OnlyIfFits), Ok(()));
    }

    #[test]
    fn a_model_larger_than_the_budget_is_refused_by_name() {
        let mut memory = ModelMemory::new(100);
        memory.insert("a", blob(50), 1, Room::Evict).unwrap();
        let refused = memory.insert("huge", blob(101), 2, Room::Evict).err().unwrap();
        assert_eq!(refused, MemoryError::OverBudget { model_id: "huge".into(), bytes: 101, budget: 100 });
        assert!(refused.to_string().contains("huge"));
        assert_eq!(memory.ids(), ["a"], "refusing it evicted nothing");
    }

    #[test]
    fn a_jobs_model_survives_its_eviction() {
        let mut memory = ModelMemory::new(100);
        memory.insert("a", blob(60), 1, Room::Evict).unwrap();
        let in_use = memory.take("a", 2).unwrap();
        let evicted = memory.insert("b", blob(60), 3, Room::Evict).unwrap();
        assert_eq!(ids(&evicted), ["a"]);
        drop(evicted);
        // The job still reads its model's bytes; they are freed when it drops its reference.
        assert_eq!(in_use.data.len(), 60);
        assert!(in_use.data.iter().all(|b| *b == 7));
        assert_eq!(Arc::strong_count(&in_use), 1);
    }

    #[test]
    fn a_newer_manifest_of_the_same_model_replaces_it_in_place() {
        let mut memory = ModelMemory::new(100);
        memory.insert("a", blob(60), 1, Room::Evict).unwrap();
        memory.insert("b", blob(30), 2, Room::Evict).unwrap();
        // 70 bytes for a fit beside b once a's old 60 go: nothing evicted, a replaced.
        let evicted = memory.insert("a", blob(70), 3, Room::OnlyIfFits).unwrap();
        assert!(evicted.is_empty());
        assert_eq!(memory.ids(), ["a", "b"]);
        assert_eq!(memory.used(), 100);
    }

    #[test]
    fn memory_a_model_grows_by_after_loading_counts() {
        let mut memory = ModelMemory::new(100);
        let a = blob(40);
        memory.insert("a", Arc::clone(&a), 1, Room::Evict).unwrap();
        // A bf16 job packed a copy of a's weights.
        a.extra.store(30, Ordering::Relaxed);
        assert_eq!(memory.used(), 70);
        let refused = memory.insert("b", blob(40), 2, Room::OnlyIfFits).err().unwrap();
        assert!(matches!(refused, MemoryError::WouldEvict { free: 30, .. }));
        assert_eq!(ids(&memory.insert("b", blob(40), 2, Room::Evict).unwrap()), ["a"]);
    }
}
