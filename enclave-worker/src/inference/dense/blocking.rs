//! How much of a weight panel's depth the tile kernels take at a time, chosen once per process
//! from this CPU's cache sizes (CPUID's deterministic cache parameters), not from constants.
//!
//! A task runs every row tile of its rows against one panel before the next, so each row tile
//! reads the whole panel, and the panel must stay in L2 between them. While it fits that costs
//! nothing; once it does not (a 4,096-deep f32 panel is 1 MiB: BERT-large's FFN output), every
//! row tile streams it from L3. Cutting the depth into slices, each run by every row tile before
//! the next, keeps one slice in L2 instead; a tile's sums go to its output between slices and
//! come back for the next. The summation order is unchanged, so every blocking gives the same
//! bits (tests).

use std::ops::Range;
use std::sync::OnceLock;

use super::NR;

/// Every lane the kernels read is 4 bytes: one f32, two bf16 or four u8/i8.
const LANE_BYTES: usize = 4;

/// The L2 cache available to one thread, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct L2Size(pub usize);

impl L2Size {
    /// What the blocking assumes when CPUID does not say (a hypervisor may hide the leaf): the
    /// smallest L2 of the AVX-512 CPUs we run on (Zen 4 and 5: 1 MiB; Intel since Ice Lake:
    /// 1.25–2 MiB), shared by a hyper-thread pair.
    pub const ASSUMED: Self = Self(512 << 10);

    /// This CPU's L2 from CPUID (leaf 4 on Intel, 0x8000001D on AMD), divided among the logical
    /// processors that share it (a hyper-thread pair: an enclave's vCPUs are such pairs).
    pub fn of_this_cpu() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        {
            let l2 = raw_cpuid::CpuId::new()
                .get_cache_parameters()?
                .find(|cache| cache.level() == 2 && cache.cache_type() == raw_cpuid::CacheType::Unified)?;
            let bytes = l2.associativity() * l2.physical_line_partitions() * l2.coherency_line_size() * l2.sets();
            Some(Self(bytes / l2.max_cores_for_cache().max(1))).filter(|size| size.0 > 0)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            None
        }
    }
}

/// The dense products' cache blocking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocking {
    /// The L2 it was chosen for.
    pub l2: L2Size,
    /// Whether `l2` came from CPUID (else [`L2Size::ASSUMED`]).
    pub measured: bool,
    /// The most panel rows (4-byte lanes) a tile kernel runs at a time.
    pub depth_slice: usize,
}

impl Blocking {
    /// The deepest slice of a panel (`NR` lanes a row) that fills at most half of L2, the other
    /// half left for the row tile's activations and outputs streaming through.
    pub fn for_l2(l2: L2Size, measured: bool) -> Self {
        // A slice shallower than a few dozen steps would spend more on storing and reloading
        // the sums than it saves.
        Self { l2, measured, depth_slice: (l2.0 / 2 / (NR * LANE_BYTES)).max(64) }
    }

    /// The depth ranges a panel `depth` lanes deep is run in by a kernel that takes `step` lanes
    /// at a time (AVX-512: 1; AMX: 16): as few as `depth_slice` allows (at least one step each),
    /// of equal length (± one step), every slice but the last ending at a multiple of `step`.
    pub(crate) fn slices_in_steps(&self, depth: usize, step: usize) -> impl Iterator<Item = Range<usize>> {
        let step = step.max(1);
        let steps = depth.div_ceil(step);
        let count = steps.div_ceil((self.depth_slice / step).max(1)).max(1);
        let at = move |i: usize| (i * steps / count * step).min(depth);
        (0..count).map(move |i| at(i)..at(i + 1))
    }

    /// [`Self::slices_in_steps`] in steps of one lane.
    #[cfg(test)]
    pub(crate) fn slices(&self, depth: usize) -> impl Iterator<Item = Range<usize>> {
        self.slices_in_steps(depth, 1)
    }
}

/// This process's blocking: CPUID read once, at the first product (the engine asks at start-up).
pub fn blocking() -> &'static Blocking {
    static BLOCKING: OnceLock<Blocking> = OnceLock::new();
    BLOCKING.get_or_init(|| match L2Size::of_this_cpu() {
        Some(l2) => Blocking::for_l2(l2, true),
        None => Blocking::for_l2(L2Size::ASSUMED, false),
    })
}
