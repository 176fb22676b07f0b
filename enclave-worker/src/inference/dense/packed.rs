//! Weight matrices packed in panels for the tile kernels, how a panel's lanes lie, and the
//! activations interleaved for the AVX2 f32 kernel.

use rayon::prelude::*;

use super::{MR, NR, Unit, bf16_pair, bf16_rounded, kernel, units};

/// A `(k, n)` weight matrix (row-major, as the encoder multiplies `x · w`) in panels of `T`:
/// f32 values, or u32 lanes of two bf16 (k-pairs).
pub(crate) struct Packed<T> {
    pub(super) k: usize,
    pub(super) n: usize,
    /// Panel rows: k for f32, `ceil(k/2)` k-pairs for bf16.
    pub(super) depth: usize,
    /// How each panel's lanes lie.
    pub(super) layout: Layout,
    /// Panel after panel (`ceil(n/NR)` of them), each `depth × NR` lanes; missing rows and
    /// columns are zero.
    pub(super) panels: Vec<T>,
}

/// How a panel's `depth × NR` lanes lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Row after row of `NR` lanes: what the AVX-512 and AMX kernels read, one row a step.
    Rows,
    /// [`STRIPS`] strips of [`STRIP`] columns, each `depth` rows deep, one after the other: the
    /// AVX2 f32 kernel takes a strip a pass and reads it as one contiguous stream (rows of a
    /// 256-byte stride fill a quarter of L1's sets and come from L2 every pass).
    Strips,
}

/// Columns of a [`Layout::Strips`] strip: two AVX2 vectors.
pub(super) const STRIP: usize = 16;
/// Strips in a panel.
pub(super) const STRIPS: usize = NR / STRIP;

impl Layout {
    /// The layout the f32 kernel of `unit` reads.
    pub(super) fn of(unit: Unit) -> Self {
        match unit {
            Unit::Avx512 => Self::Rows,
            Unit::Avx2 => Self::Strips,
            Unit::Amx => unreachable!("AMX has no f32 product: units() never chooses it"),
        }
    }

    /// Where lane `(p, j)` of a panel `depth` rows deep lies in it.
    #[inline(always)]
    pub(super) fn index(self, depth: usize, p: usize, j: usize) -> usize {
        match self {
            Self::Rows => p * NR + j,
            Self::Strips => (j / STRIP * depth + p) * STRIP + j % STRIP,
        }
    }
}

impl<T: Copy + Default> Packed<T> {
    /// Panels of `depth` rows in `layout` whose lane for panel row `p`, matrix column `col` is
    /// `lane(p, col)`.
    pub(super) fn pack(k: usize, n: usize, depth: usize, layout: Layout, lane: impl Fn(usize, usize) -> T) -> Self {
        let mut panels = vec![T::default(); n.div_ceil(NR) * depth * NR];
        for (panel, lanes) in panels.chunks_exact_mut(depth * NR).enumerate() {
            for p in 0..depth {
                for j in 0..NR {
                    lanes[layout.index(depth, p, j)] = lane(p, panel * NR + j);
                }
            }
        }
        Self { k, n, depth, layout, panels }
    }

    pub(crate) fn rows(&self) -> usize {
        self.k
    }

    pub(crate) fn cols(&self) -> usize {
        self.n
    }

    /// Bytes of the panels (padding included).
    pub(crate) fn memory_bytes(&self) -> usize {
        std::mem::size_of_val(self.panels.as_slice())
    }
}

impl Packed<f32> {
    /// Packs `w`, `(k, n)` row-major, for this process's f32 kernel ([`units`]; row by row
    /// where there is none, to be converted or quantised).
    pub(crate) fn f32(w: &[f32], k: usize, n: usize) -> Self {
        Self::f32_in(w, k, n, units().f32.map_or(Layout::Rows, Layout::of))
    }

    /// Packs `w`, `(k, n)` row-major, for the f32 kernel of `unit` (AVX-512 or AVX2).
    pub(crate) fn f32_for(w: &[f32], k: usize, n: usize, unit: Unit) -> Self {
        Self::f32_in(w, k, n, Layout::of(unit))
    }

    /// Packs `w`, `(k, n)` row-major, in `layout`.
    pub(super) fn f32_in(w: &[f32], k: usize, n: usize, layout: Layout) -> Self {
        assert_eq!(w.len(), k * n, "weights are not (k, n)");
        Self::pack(k, n, k, layout, |p, col| if col < n { w[p * n + col] } else { 0.0 })
    }

    /// The same weights rounded to bf16 (padding stays zero).
    pub(crate) fn bf16_rounded(&self) -> Self {
        Self { panels: self.panels.iter().map(|&v| bf16_rounded(v)).collect(), ..*self }
    }

    /// Per row (input channel), the largest |weight|.
    pub(crate) fn row_abs_max(&self) -> Vec<f32> {
        (0..self.k).map(|row| (0..self.n).map(|col| self.value(row, col).abs()).fold(0f32, f32::max)).collect()
    }

    /// `w[row][col]`; zero outside the matrix.
    pub(super) fn value(&self, row: usize, col: usize) -> f32 {
        if row < self.k && col < self.n {
            self.panels[col / NR * self.depth * NR + self.layout.index(self.depth, row, col % NR)]
        } else {
            0.0
        }
    }
}

impl Packed<u32> {
    /// The same weights rounded to bf16, for the bf16 kernel.
    pub(crate) fn bf16(w: &Packed<f32>) -> Self {
        Self::pack(w.k, w.n, w.k.div_ceil(2), Layout::Rows, |p, col| bf16_pair(w.value(2 * p, col), w.value(2 * p + 1, col)))
    }
}

/// Values per step of an [`Interleaved`] tile: its [`MR`] rows and two of zeros, so that a step
/// is one 32-byte vector and the interleaving a transpose of 8 × 8 blocks.
pub(super) const STEP_LANES: usize = 8;

/// A task's activations as the AVX2 f32 kernel reads them: tile after tile of [`MR`] rows (the
/// last padded with zero rows), each tile step after step, row `r`'s value of step `p` at
/// `p·STEP_LANES + r`. A pass's broadcasts then read one stream where row-major rows were six
/// (and, 1,024 values deep, 4 KiB apart: the same L1 sets).
pub(super) struct Interleaved {
    lanes: Vec<f32>,
    /// The task's rows (without the padding).
    pub(super) rows: usize,
    k: usize,
}

impl Interleaved {
    /// `rows` rows of `x` (`k` values each, row-major), on a CPU with AVX2.
    pub(super) fn of(x: &[f32], rows: usize, k: usize) -> Self {
        assert!(x.len() >= rows * k, "activations are not (rows, k)");
        let mut lanes = vec![0f32; rows.div_ceil(MR) * k * STEP_LANES];
        let whole = k / STEP_LANES * STEP_LANES;
        // In parallel (four tiles a task at least) for a batch split by panels, whose rows are
        // interleaved once for every thread: one 128-token text took that path before short
        // batches were split by rows (about 5 % less latency then, 11 pairs of runs), and does
        // still with 8 threads. Inside a task of a row split it measured neither faster nor
        // slower (one 128-token or 42-token text, 2 threads, 300 alternating rounds).
        lanes.par_chunks_exact_mut(k * STEP_LANES).with_min_len(4).enumerate().for_each(|(index, tile)| {
            let tile_rows: Vec<&[f32]> = x[..rows * k].chunks_exact(k).skip(index * MR).take(MR).collect();
            kernel::avx2_f32::interleave(&tile_rows, whole, tile);
            for p in whole..k {
                for (r, row) in tile_rows.iter().enumerate() {
                    tile[p * STEP_LANES + r] = row[p];
                }
            }
        });
        Self { lanes, rows, k }
    }

    /// Row tile `index` from step `step` on.
    pub(super) fn tile(&self, index: usize, step: usize) -> &[f32] {
        &self.lanes[(index * self.k + step) * STEP_LANES..(index + 1) * self.k * STEP_LANES]
    }
}
