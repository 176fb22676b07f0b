//! The dense layers' matrix products `x · w` on AVX-512, with kernels of our own: f32 inputs
//! (`vfmadd231ps`), bf16 inputs with f32 accumulation (`vdpbf16ps`) for jobs that ask for
//! `precision: bf16`, and u8 × i8 with int32 accumulation (`vpdpbusd`) for `precision: int8`.
//!
//! Its `kernel` submodule (with `kernel::amx` and `kernel::avx2`) and [`super::strided`] are the
//! crate's only `unsafe` code: the SIMD intrinsics and AMX's `asm!`, behind a safe API ([`Packed`], [`Int8Weights`], [`matmul_f32`], [`matmul_bf16`],
//! [`matmul_int8`]) that checks every length before a kernel runs and refuses to run on a CPU
//! without the instructions ([`f32_supported`], [`bf16_supported`], [`int8_supported`]).
//!
//! int8: weights are quantised once per output column (symmetric, `[-127, 127]`), activations per
//! row as they come (asymmetric u8 over `[min(x, 0), max(x, 0)]`, scale and zero point per row, by
//! an AVX-512 or AVX2 kernel that equals a scalar definition byte for byte, tests).
//! `vpdpbusd` sums four u8 × i8 products per int32 lane, so both operands hold *quads along k*,
//! as bf16 holds pairs. With `x ≈ s_x (u − z)` and `w ≈ s_w q`,
//! `x · w ≈ s_x s_w (Σ u q − z Σ q)`: the column sums `Σ q` are computed at quantisation, and the
//! tile kernel dequantises its int32 sums to f32 before storing. A scalar reference of the same
//! arithmetic (`int8_tile_reference`) must equal the kernel bit for bit (tests). A few input
//! channels may stay exact: left out of both quantisations, their f32 share is added by the tile
//! kernel after dequantising (one FMA per channel, with the tile still in registers).
//!
//! `vdpbf16ps acc, a, b` adds, in each of its 16 f32 lanes, `a.lo·b.lo + a.hi·b.hi` of the lane's
//! two bf16 halves. So for bf16 both operands hold *pairs along k*: a weight panel lane holds
//! `(w[2p][j], w[2p+1][j])` for its column `j`, and the activation operand is one row's pair
//! `(x[i][2p], x[i][2p+1])` broadcast to every lane. Rounding to bf16 is to nearest, ties to even
//! (what `vcvtne2ps2bf16` does); products and sums are f32. For f32 the "depth" is k itself.
//!
//! Blocking: weights are packed once (at load, or on the first bf16 job) into panels of [`NR`]
//! columns, depth × 64 lanes. Each task takes [`MC`] rows of activations, or a thread's share of
//! a short batch's ([`product`]) (f32: read in place; bf16: converted to row-major pairs in one
//! vectorised pass), and runs every `MR × NR` tile of its rows against every panel: 24
//! accumulators stay in registers for a depth slice, the panel's slice comes from L2 and is
//! reused by all the task's row tiles, and results are stored straight into the output rows.
//! How deep a slice is comes from this CPU's L2 size ([`blocking`]); the panels of
//! all-MiniLM-L6-v2 are shallow enough to be one slice on every CPU we run on.
//!
//! AVX2: on a CPU without AVX-512 VNNI (Zen 3), int8 runs on `vpmaddwd` instead (`kernel::avx2`):
//! the same operands widened to i16 in registers, the same int32 sums, the same bits. On a CPU
//! without AVX-512, f32 runs on AVX2's FMA (`kernel::avx2_f32`), the same tile 16 columns a pass
//! and each sum the same chain of FMAs, so the same bits; its panels lie in strips of 16 columns
//! ([`Layout::Strips`]) so that a pass streams its strip, and each task's activations are
//! interleaved step by step ([`Interleaved`]) so that its broadcasts read one stream. bf16 does
//! not run there.
//!
//! AMX: where the CPU has AMX tiles and Linux grants their state ([`units`], chosen once at
//! start-up), bf16 runs on `tdpbf16ps` and int8 on `tdpbusd` (the same u8 × i8 operands) instead,
//! one more tile kernel ([`TileKernel`]) behind the same blocking and products: 32 rows a tile
//! instead of `MR`, depth slices beginning at whole steps of 16 lanes, the same packed panels
//! (AMX's B operand has their layout). int8 gives the VNNI kernel's bits (tests); bf16 does not
//! add the 32 products of a `tdpbf16ps` one by one in f32 as `vdpbf16ps` does, so it agrees with
//! the AVX-512 kernel within f32 summation error, not bit for bit (tests state the bound).

use rayon::prelude::*;

pub use blocking::{Blocking, L2Size, blocking};
pub use unit::{Unit, Units, bf16_pays, units};

/// Columns per weight panel (4 vectors of 16 lanes).
const NR: usize = 64;
/// Rows per register tile.
const MR: usize = 6;
/// Rows per task (a multiple of `MR`).
const MC: usize = 16 * MR;
/// Rows a task takes at least when fewer than [`MC`] rows a thread are split by rows: one
/// 128-token text 4–13 % faster split by rows than by panels, a 22-token one 15 % slower
/// (medians of alternating runs in one process, Zen 3, 2 threads).
const MIN_TASK_ROWS: usize = 4 * MR;

/// Whether this CPU executes an f32 kernel of ours: AVX-512's, or AVX2's with FMA (the same
/// bits).
pub(crate) fn f32_supported() -> bool {
    avx512_supported() || avx2_supported()
}

/// Whether this CPU executes the AVX-512 kernels' common ground (AVX-512 F).
pub(crate) fn avx512_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU executes the bf16 kernel (AVX-512 F + BF16).
pub(crate) fn bf16_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx512_supported() && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// f32 → bf16, round to nearest, ties to even (inputs are finite: NaN is not preserved).
#[inline(always)]
fn bf16_bits(x: f32) -> u32 {
    let bits = x.to_bits();
    (bits + 0x7fff + ((bits >> 16) & 1)) >> 16
}

/// bf16 → f32 (exact).
fn bf16_value(bits: u32) -> f32 {
    f32::from_bits(bits << 16)
}

/// `x` rounded to bf16, as an f32: bf16's inputs on a CPU without a bf16 kernel.
pub(crate) fn bf16_rounded(x: f32) -> f32 {
    bf16_value(bf16_bits(x))
}

/// `lo` and `hi` rounded to bf16 and packed as one `vdpbf16ps` lane.
#[inline(always)]
pub(crate) fn bf16_pair(lo: f32, hi: f32) -> u32 {
    bf16_bits(lo) | (bf16_bits(hi) << 16)
}

/// One depth slice of a tile's product ([`blocking`]): the activations' rows lie `lda` lanes
/// apart; the sums start from zero in a panel's `first` slice and from `out` (the slices
/// before) in the others; the int8 kernel dequantises after the `last` and, before it, leaves
/// its int32 sums in `out` (their bits).
#[derive(Clone, Copy)]
struct Slice {
    lda: usize,
    first: bool,
    last: bool,
}

/// A tile kernel: `run(a, b, depth, out, ldc, rows, slice)` computes one depth slice of a
/// `rows × NR` tile (`rows` at most the kernel's [`TileKernel::rows`]),
/// `out[r·ldc + j] (+)= Σ_{p < depth} a[r·lda + p] ⊙ b[p·NR + j]`, reading `a` as whole tiles
/// (padding rows zero); `F` is [`Tile`] or, for int8, [`Int8Tile`].
#[derive(Clone, Copy)]
struct TileKernel<F> {
    /// Rows of a tile: the activations are padded to a multiple of it.
    rows: usize,
    /// Where a depth slice may begin: a multiple of this many lanes (the kernel's step, so that
    /// every blocking groups the sums alike).
    step: usize,
    run: F,
}

type Tile<T> = fn(&[T], &[T], usize, &mut [f32], usize, usize, Slice);

const F32_AVX512: TileKernel<Tile<f32>> = TileKernel { rows: MR, step: 1, run: kernel::f32_tile };
const BF16_AVX512: TileKernel<Tile<u32>> = TileKernel { rows: MR, step: 1, run: kernel::bf16_tile };
const BF16_AMX: TileKernel<Tile<u32>> = TileKernel { rows: kernel::amx::ROWS, step: kernel::amx::STEP, run: kernel::amx::bf16_tile };
const INT8_VNNI: TileKernel<Int8Tile> = TileKernel { rows: MR, step: 1, run: kernel::int8_tile };
const INT8_AMX: TileKernel<Int8Tile> = TileKernel { rows: kernel::amx::ROWS, step: kernel::amx::STEP, run: kernel::amx::int8_tile };
const INT8_AVX2: TileKernel<Int8Tile> = TileKernel { rows: MR, step: 1, run: kernel::avx2::int8_tile };

/// The bf16 kernel of `unit`.
fn bf16_kernel(unit: Unit) -> TileKernel<Tile<u32>> {
    match unit {
        Unit::Avx512 => BF16_AVX512,
        Unit::Amx => BF16_AMX,
        Unit::Avx2 => unreachable!("bf16 has no AVX2 kernel: units() never chooses it"),
    }
}

/// The int8 kernel of `unit`.
fn int8_kernel(unit: Unit) -> TileKernel<Int8Tile> {
    match unit {
        Unit::Avx512 => INT8_VNNI,
        Unit::Amx => INT8_AMX,
        Unit::Avx2 => INT8_AVX2,
    }
}

/// A lane type the activations are made of.
trait Lane: Copy + Default + Send + Sync + 'static {
    /// `rows` rows of `x` (`k` values each) as this lane type, row-major, `depth` lanes per row,
    /// `pad_to` rows (the rest zero).
    fn rows_of(x: &[f32], rows: usize, k: usize, depth: usize, pad_to: usize) -> Vec<Self>;
}

impl Lane for f32 {
    fn rows_of(x: &[f32], rows: usize, k: usize, _: usize, pad_to: usize) -> Vec<f32> {
        let mut a = vec![0f32; pad_to * k];
        a[..rows * k].copy_from_slice(&x[..rows * k]);
        a
    }
}

impl Lane for u32 {
    fn rows_of(x: &[f32], rows: usize, k: usize, depth: usize, pad_to: usize) -> Vec<u32> {
        let mut a = vec![0u32; pad_to * depth];
        super::kernels::vectorized(
            #[inline(always)]
            || {
                for (lanes, row) in a.chunks_exact_mut(depth).zip(x[..rows * k].chunks_exact(k)) {
                    for (lane, two) in lanes.iter_mut().zip(row.chunks_exact(2)) {
                        *lane = bf16_pair(two[0], two[1]);
                    }
                    if k % 2 == 1 {
                        lanes[depth - 1] = bf16_pair(row[k - 1], 0.0);
                    }
                }
            },
        );
        a
    }
}

/// A task's activations as the kernel reads them: whole row tiles (in place for f32) and, when
/// the row count is not a multiple of the kernel's rows, a zero-padded last tile.
struct Rows<'a, T: Lane> {
    whole: std::borrow::Cow<'a, [T]>,
    tail: Option<Vec<T>>,
    rows: usize,
}

impl<T: Lane> Rows<'_, T> {
    /// Row tile `index` of `mr` rows, `depth` lanes each.
    fn tile(&self, index: usize, mr: usize, depth: usize) -> &[T] {
        let whole_tiles = self.whole.len() / (mr * depth).max(1);
        match index.checked_sub(whole_tiles) {
            None => &self.whole[index * mr * depth..(index + 1) * mr * depth],
            Some(_) => self.tail.as_deref().expect("a tile per kernel rows"),
        }
    }
}

fn rows_f32(x: &[f32], rows: usize, k: usize) -> Rows<'_, f32> {
    let whole_rows = rows / MR * MR;
    let tail = (whole_rows < rows).then(|| f32::rows_of(&x[whole_rows * k..], rows - whole_rows, k, k, MR));
    Rows { whole: std::borrow::Cow::Borrowed(&x[..whole_rows * k]), tail, rows }
}

/// Columns of a panel and rows of a tile of [`f32_tile`].
pub(crate) const PANEL: usize = NR;
pub(crate) const TILE_ROWS: usize = MR;

/// One `rows × PANEL` tile of `a · b` through the f32 kernel, for attention's blocks
/// (`encoder::attention`): `out[r·ldc + j] (+)= Σ_{p < depth} a[r·lda + p] · b[p·PANEL + j]`,
/// from zero unless `accumulate`. `a` holds [`TILE_ROWS`] rows, `lda` apart (those past `rows`
/// are read, never stored); `b` is one panel, `depth` rows of [`PANEL`] values. On AVX-512, or
/// AVX2 without it: the same bits.
///
/// Panics if the lengths do not match or the CPU has neither ([`f32_supported`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn f32_tile(a: &[f32], lda: usize, b: &[f32], depth: usize, out: &mut [f32], ldc: usize, rows: usize, accumulate: bool) {
    let slice = Slice { lda, first: !accumulate, last: true };
    if avx512_supported() {
        kernel::f32_tile(a, b, depth, out, ldc, rows, slice);
    } else {
        kernel::avx2_f32::f32_rows_tile(a, b, depth, out, ldc, rows, slice);
    }
}

/// [`f32_tile`] with bf16 inputs and f32 sums: `a` and `b` hold lanes of two bf16
/// ([`bf16_pair`]), `depth` lanes deep, and each lane adds both of its products.
///
/// Panics if the lengths do not match or the CPU lacks AVX-512 BF16 ([`bf16_supported`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn bf16_tile(a: &[u32], lda: usize, b: &[u32], depth: usize, out: &mut [f32], ldc: usize, rows: usize, accumulate: bool) {
    kernel::bf16_tile(a, b, depth, out, ldc, rows, Slice { lda, first: !accumulate, last: true });
}

/// Rows of bf16 pairs for a kernel of `tile_rows` rows.
fn rows_bf16(x: &[f32], rows: usize, k: usize, depth: usize, tile_rows: usize) -> Rows<'static, u32> {
    Rows { whole: std::borrow::Cow::Owned(u32::rows_of(x, rows, k, depth, rows.div_ceil(tile_rows) * tile_rows)), tail: None, rows }
}

/// `out ← x · w` in f32: `x` is `(m, k)` row-major, `out` `(m, n)`, on the kernel `w` was
/// packed for (AVX-512 or AVX2: the same bits).
///
/// Panics if the lengths do not match or the CPU lacks that kernel's instructions.
pub(crate) fn matmul_f32(x: &[f32], m: usize, w: &Packed<f32>, out: &mut [f32]) {
    f32_product(x, m, w, out, blocking());
}

/// [`matmul_f32`] with the given blocking.
fn f32_product(x: &[f32], m: usize, w: &Packed<f32>, out: &mut [f32], blocking: &Blocking) {
    match w.layout {
        Layout::Rows => {
            assert!(avx512_supported(), "the CPU has no AVX-512");
            packed_product(x, m, w, out, blocking, F32_AVX512, |x, rows| rows_f32(x, rows, w.k));
        }
        Layout::Strips => {
            assert!(avx2_supported(), "the CPU has no AVX2 with FMA");
            let interleave = |x, rows| Interleaved::of(x, rows, w.k);
            product(x, (m, w.k, w.n), MR, out, interleave, |a, panel, out, ldc| {
                let lanes = &w.panels[panel * w.depth * NR..(panel + 1) * w.depth * NR];
                tiles_of_panel(a.rows, NR.min(w.n - panel * NR), w.depth, blocking, (MR, 1), out, ldc, |index, valid, range, slice, out, ldc| {
                    kernel::avx2_f32::f32_tile(a.tile(index, range.start), lanes, w.depth, range, out, ldc, valid, slice);
                });
            });
        }
    }
}

/// `out ← x · w` with bf16 inputs and f32 sums: `x` is `(m, k)` row-major f32, `out` `(m, n)`.
///
/// Runs on the unit [`units`] chose (AMX tiles or AVX-512).
///
/// Panics if the lengths do not match or the CPU lacks AVX-512 BF16 ([`bf16_supported`]).
pub(crate) fn matmul_bf16(x: &[f32], m: usize, w: &Packed<u32>, out: &mut [f32]) {
    let unit = units().bf16.expect("the CPU has no AVX-512 BF16");
    bf16_product(x, m, w, out, blocking(), bf16_kernel(unit));
}

/// [`matmul_bf16`] with the given blocking and kernel.
fn bf16_product(x: &[f32], m: usize, w: &Packed<u32>, out: &mut [f32], blocking: &Blocking, tile: TileKernel<Tile<u32>>) {
    packed_product(x, m, w, out, blocking, tile, |x, rows| rows_bf16(x, rows, w.k, w.depth, tile.rows));
}

/// `out ← x · w` through `tile`, each task's rows of `x` made lanes by `prepare`.
fn packed_product<'x, T: Lane>(
    x: &'x [f32],
    m: usize,
    w: &Packed<T>,
    out: &mut [f32],
    blocking: &Blocking,
    tile: TileKernel<Tile<T>>,
    prepare: impl Fn(&'x [f32], usize) -> Rows<'x, T> + Sync,
) {
    product(x, (m, w.k, w.n), tile.rows, out, prepare, |a, panel, out, ldc| run_panel(a, w, panel, out, ldc, blocking, tile));
}

/// Runs on the current rayon pool: one task per [`MC`] rows when there are enough rows for
/// every thread; with fewer, one share of the rows (whole tiles of `tile_rows`) per thread
/// when every thread has one of [`MIN_TASK_ROWS`] at least (one text of 128 tokens); otherwise
/// (a short text) one task per weight panel, each into a block of its own, then copied into
/// `out`. `prepare` turns rows of `x` into what the kernel reads; `run(a, panel, out, ldc)`
/// computes one panel's columns for all of `a`'s rows into `out` (row stride `ldc`, see
/// [`run_panel`]).
fn product<'x, A: Sync>(
    x: &'x [f32],
    (m, k, n): (usize, usize, usize),
    tile_rows: usize,
    out: &mut [f32],
    prepare: impl Fn(&'x [f32], usize) -> A + Sync,
    run: impl Fn(&A, usize, &mut [f32], usize) + Sync,
) {
    assert_eq!(x.len(), m * k, "activations are not (m, k)");
    assert_eq!(out.len(), m * n, "output is not (m, n)");
    if m == 0 || n == 0 {
        return;
    }
    let panels = n.div_ceil(NR);
    let threads = rayon::current_num_threads();
    let task_rows = if m >= MC * threads { MC } else { m.div_ceil(threads).div_ceil(tile_rows) * tile_rows };
    if task_rows >= MIN_TASK_ROWS && m.div_ceil(task_rows) >= threads {
        out.par_chunks_mut(task_rows * n).zip(x.par_chunks(task_rows * k)).for_each(|(out, x)| {
            let a = prepare(x, x.len() / k);
            for panel in 0..panels {
                run(&a, panel, &mut out[panel * NR..], n);
            }
        });
    } else {
        let a = prepare(x, m);
        let blocks: Vec<Vec<f32>> = (0..panels)
            .into_par_iter()
            .map(|panel| {
                let mut block = vec![0f32; m * NR];
                run(&a, panel, &mut block, NR);
                block
            })
            .collect();
        for (panel, block) in blocks.iter().enumerate() {
            let width = NR.min(n - panel * NR);
            for (row, values) in block.chunks_exact(NR).enumerate() {
                out[row * n + panel * NR..row * n + panel * NR + width].copy_from_slice(&values[..width]);
            }
        }
    }
}

/// Every row tile of `a` against weight panel `panel`, into `out` (row stride `ldc`, the panel's
/// first column at `out[0]`).
fn run_panel<T: Lane>(
    a: &Rows<'_, T>,
    w: &Packed<T>,
    panel: usize,
    out: &mut [f32],
    ldc: usize,
    blocking: &Blocking,
    kernel: TileKernel<Tile<T>>,
) {
    let (depth, mr) = (w.depth, kernel.rows);
    let lanes = &w.panels[panel * depth * NR..(panel + 1) * depth * NR];
    assert_eq!(w.layout, Layout::Rows, "the tile kernels read panels row by row");
    let width = NR.min(w.n - panel * NR);
    tiles_of_panel(a.rows, width, depth, blocking, (mr, kernel.step), out, ldc, |index, valid, range, slice, out, ldc| {
        let tile = a.tile(index, mr, depth);
        (kernel.run)(&tile[range.start..], &lanes[range.start * NR..], range.len(), out, ldc, valid, slice)
    });
}

/// Calls `tile(index, valid_rows, depth_range, slice, out, ldc)` for every `mr`-row tile of
/// `rows` rows of one panel `width` columns wide and `depth` lanes deep, slice after slice of
/// `blocking` (each beginning at a multiple of `step` lanes), each slice for every tile before
/// the next. Rows past `rows` are not written;
/// columns past `width` are written only where `ldc` leaves room for a whole panel, else the
/// panel goes through a scratch block and only its real columns are copied.
#[allow(clippy::too_many_arguments)]
fn tiles_of_panel(
    rows: usize,
    width: usize,
    depth: usize,
    blocking: &Blocking,
    (mr, step): (usize, usize),
    out: &mut [f32],
    ldc: usize,
    mut tile: impl FnMut(usize, usize, std::ops::Range<usize>, Slice, &mut [f32], usize),
) {
    if width < NR && ldc != NR {
        // The matrix's last, narrower panel.
        let mut block = vec![0f32; rows * NR];
        tiles_of_panel(rows, NR, depth, blocking, (mr, step), &mut block, NR, tile);
        for (out, block) in out.chunks_mut(ldc).zip(block.chunks_exact(NR)) {
            out[..width].copy_from_slice(&block[..width]);
        }
        return;
    }
    for range in blocking.slices_in_steps(depth, step) {
        let slice = Slice { lda: depth, first: range.start == 0, last: range.end == depth };
        for index in 0..rows.div_ceil(mr) {
            tile(index, mr.min(rows - index * mr), range.clone(), slice, &mut out[index * mr * ldc..], ldc);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// int8: u8 activations × i8 weights, int32 sums (`vpdpbusd`), dequantised to f32.

/// Whether this CPU executes an int8 tile kernel: AVX-512 VNNI's or AVX2's (the same bits).
pub(crate) fn int8_supported() -> bool {
    vnni_supported() || avx2_supported()
}

/// Whether this CPU executes the VNNI int8 kernel and the AVX-512 quantisation (AVX-512 F + BW
/// + VNNI).
pub(crate) fn vnni_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx512_supported()
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU executes the AVX2 int8 kernel (AVX2 + FMA).
pub(crate) fn avx2_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Four bytes as one `vpdpbusd` lane (byte 0 = the lowest k).
#[inline(always)]
fn quad(bytes: [u8; 4]) -> u32 {
    u32::from_le_bytes(bytes)
}

/// A `(k, n)` weight matrix quantised for the int8 kernel: per output column `j` a symmetric
/// scale `scale[j] = max_p |w[p][j]| / 127` and values `q = round(w / scale)` in `[-127, 127]`,
/// packed as panels of k-quads (4 i8 per u32 lane, `ceil(k/4)` panel rows); `sum[j] = Σ_p q[p][j]`
/// for the activations' zero-point term. Optionally smoothed: weight row `p` was multiplied by
/// `smooth[p]` before quantising, and activations are divided by it before theirs. Optionally a
/// few input channels stay exact (LLM.int8()-style decomposition): their weight rows are left
/// out of the int8 matrix (zero), the activations' values in them are zeroed before
/// quantising, and their share of the product is computed in f32 and added.
pub(crate) struct Int8Weights {
    panels: Packed<u32>,
    /// Per column, padded with zeros to whole panels.
    scale: Vec<f32>,
    sum: Vec<i32>,
    /// `1 / smooth[p]` per input channel (1 unsmoothed, 0 for an exact channel): the factor the
    /// quantisation kernel multiplies each activation by.
    inv_smooth: Vec<f32>,
    /// The exact channels and their original weight rows, `(channels, n)`.
    exact: Option<(Vec<usize>, Packed<f32>)>,
}

impl Int8Weights {
    /// Quantises `w` (packed for the f32 kernel), after multiplying its row `p` by `smooth[p]`
    /// when given (SmoothQuant: the activations' channel `p` is divided by the same factor).
    ///
    /// `exact` lists input channels (each below `k`, no repeats) computed in f32 instead.
    pub(crate) fn new(w: &Packed<f32>, smooth: Option<&[f32]>, exact: &[usize]) -> Self {
        let (k, n) = (w.k, w.n);
        if let Some(s) = smooth {
            assert_eq!(s.len(), k, "one smoothing factor per input channel");
        }
        let mut is_exact = vec![false; k];
        for &c in exact {
            assert!(c < k && !is_exact[c], "exact channels are distinct input channels");
            is_exact[c] = true;
        }
        let factor = |row: usize| if is_exact[row] { 0.0 } else { smooth.map_or(1.0, |s| s[row]) };
        let value = |row: usize, col: usize| w.value(row, col) * factor(row);
        let cols = n.div_ceil(NR) * NR;
        let mut scale = vec![0f32; cols];
        let mut sum = vec![0i32; cols];
        let mut q = vec![0i8; k * cols];
        for (col, scale) in scale.iter_mut().enumerate().take(n) {
            let max = (0..k).map(|row| value(row, col).abs()).fold(0f32, f32::max);
            *scale = if max > 0.0 { max / 127.0 } else { 1.0 };
        }
        for row in 0..k {
            for col in 0..n {
                let v = (value(row, col) / scale[col]).round_ties_even().clamp(-127.0, 127.0) as i8;
                q[row * cols + col] = v;
                sum[col] += i32::from(v);
            }
        }
        let at = |row: usize, col: usize| if row < k { q[row * cols + col] as u8 } else { 0 };
        let panels = Packed::pack(k, n, k.div_ceil(4), Layout::Rows, |p, col| {
            quad([at(4 * p, col), at(4 * p + 1, col), at(4 * p + 2, col), at(4 * p + 3, col)])
        });
        let inv_smooth = (0..k).map(|row| if is_exact[row] { 0.0 } else { 1.0 / factor(row) }).collect();
        let exact = (!exact.is_empty()).then(|| {
            let rows: Vec<f32> = exact.iter().flat_map(|&c| (0..n).map(move |col| w.value(c, col))).collect();
            // Read a row a step by every int8 kernel.
            (exact.to_vec(), Packed::f32_in(&rows, exact.len(), n, Layout::Rows))
        });
        Self { panels, scale, sum, inv_smooth, exact }
    }

    pub(crate) fn rows(&self) -> usize {
        self.panels.k
    }

    pub(crate) fn cols(&self) -> usize {
        self.panels.n
    }

    /// Bytes of the int8 panels, their per-column scales and sums, and the exact channels.
    pub(crate) fn memory_bytes(&self) -> usize {
        let exact = self.exact.as_ref().map_or(0, |(channels, rows)| std::mem::size_of_val(channels.as_slice()) + rows.memory_bytes());
        self.panels.memory_bytes()
            + std::mem::size_of_val(self.scale.as_slice())
            + std::mem::size_of_val(self.sum.as_slice())
            + std::mem::size_of_val(self.inv_smooth.as_slice())
            + exact
    }
}

/// Rows of activations quantised per row (per token), asymmetric u8: `x ≈ scale · (q − zero)`,
/// the range `[min(x, 0), max(x, 0)]` mapped onto `[0, 255]`. `lanes` holds rows padded to whole
/// kernel tiles, rows of
/// `depth` k-quads; padding rows and k past the row's end are zero.
struct Quantized {
    lanes: Vec<u32>,
    scale: Vec<f32>,
    zero: Vec<i32>,
    /// Per padded row, the values of the weights' exact channels (f32, unquantised).
    exact: Vec<f32>,
    rows: usize,
}

/// Quantises `rows` rows of `x` (`k` values each, multiplied by `inv_smooth` first), padded to
/// whole tiles of `tile_rows`. The values of the `exact` channels are gathered as they are.
fn quantize_rows(x: &[f32], rows: usize, k: usize, inv_smooth: &[f32], exact: &[usize], tile_rows: usize) -> Quantized {
    let depth = k.div_ceil(4);
    let padded = rows.div_ceil(tile_rows) * tile_rows;
    let mut gathered = vec![0f32; padded * exact.len()];
    for (values, row) in gathered.chunks_exact_mut(exact.len().max(1)).zip(x[..rows * k].chunks_exact(k)) {
        for (v, &c) in values.iter_mut().zip(exact) {
            *v = row[c];
        }
    }
    let mut q = Quantized {
        lanes: vec![0u32; padded * depth],
        scale: vec![0f32; padded],
        zero: vec![0i32; padded],
        exact: gathered,
        rows,
    };
    // A kernel where the CPU has one, else the plain definition they equal byte for byte.
    let quantize_row: QuantizeRow = if vnni_supported() {
        kernel::quantize_row
    } else if avx2_supported() {
        kernel::avx2::quantize_row
    } else {
        quantize_row_plain_into_lanes
    };
    for (((row, lanes), scale), zero) in
        x[..rows * k].chunks_exact(k).zip(q.lanes.chunks_exact_mut(depth)).zip(&mut q.scale).zip(&mut q.zero)
    {
        (*scale, *zero) = quantize_row(row, inv_smooth, lanes);
    }
    q
}

/// `(row, inv_smooth, lanes) → (scale, zero)`: one row of activations quantised into lanes.
type QuantizeRow = fn(&[f32], &[f32], &mut [u32]) -> (f32, i32);

/// [`quantize_row_plain`] into lanes as the kernel writes them (four bytes to a u32,
/// little-endian).
fn quantize_row_plain_into_lanes(row: &[f32], inv_smooth: &[f32], lanes: &mut [u32]) -> (f32, i32) {
    let mut bytes = vec![0u8; lanes.len() * 4];
    let mapping = quantize_row_plain(row, inv_smooth, &mut bytes[..row.len()]);
    for (lane, quad) in lanes.iter_mut().zip(bytes.chunks_exact(4)) {
        *lane = u32::from_le_bytes([quad[0], quad[1], quad[2], quad[3]]);
    }
    mapping
}

/// The activations' quantisation written out plainly: each value times its smoothing factor,
/// the range `[min(x, 0), max(x, 0)]` onto `[0, 255]`, rounded to nearest, ties to even (a NaN
/// value skipped by the range and quantised to 0); `(scale, zero)`. It does not call
/// [`row_mapping`], so that the kernel's tests check that helper rather than share it.
fn quantize_row_plain(row: &[f32], inv_smooth: &[f32], bytes: &mut [u8]) -> (f32, i32) {
    let smoothed: Vec<f32> = row.iter().zip(inv_smooth).map(|(&v, &f)| v * f).collect();
    let lo = smoothed.iter().copied().fold(0f32, f32::min);
    let hi = smoothed.iter().copied().fold(0f32, f32::max);
    let range = hi - lo;
    if range == 0.0 || !range.is_finite() {
        bytes.fill(0);
        return (if range == 0.0 { 1.0 } else { f32::NAN }, 0);
    }
    let scale = range / 255.0;
    let inv = 1.0 / scale;
    let zero = (-lo * inv).round_ties_even().clamp(0.0, 255.0);
    for (b, &v) in bytes.iter_mut().zip(&smoothed) {
        *b = if v.is_nan() { 0 } else { (v * inv + zero).clamp(0.0, 255.0).round_ties_even() as u8 };
    }
    (scale, zero as i32)
}

/// How a row whose values lie in `[lo, hi]` (0 included) maps onto u8: `Ok((scale, 1/scale,
/// zero))`, a value `v` becoming `round(clamp(v · (1/scale) + zero, 0, 255))`, ties to even; or
/// `Err(scale)` when every byte is 0: all zeros (exact, scale 1), or an infinite value (scale
/// NaN: NaN out, as the f32 product would give).
#[inline(always)] // into the AVX-512 kernel, where its rounding is one instruction, not a libm call
fn row_mapping(lo: f32, hi: f32) -> Result<(f32, f32, f32), f32> {
    let range = hi - lo;
    if range == 0.0 || !range.is_finite() {
        return Err(if range == 0.0 { 1.0 } else { f32::NAN });
    }
    let scale = range / 255.0;
    let inv = 1.0 / scale;
    Ok((scale, inv, (-lo * inv).round_ties_even().clamp(0.0, 255.0)))
}

/// `out ← x · w` in int8: each row of `x` (`(m, k)` row-major f32) quantised to u8 on the fly,
/// multiplied by `w`'s i8 values with int32 sums, dequantised to f32 into `out` (`(m, n)`).
///
/// Runs on the unit [`units`] chose (AMX tiles, AVX-512 VNNI or AVX2); all give the same bits.
///
/// Panics if the lengths do not match or the CPU has no int8 kernel ([`int8_supported`]).
pub(crate) fn matmul_int8(x: &[f32], m: usize, w: &Int8Weights, out: &mut [f32]) {
    let unit = units().int8.expect("the CPU has neither AVX-512 VNNI nor AVX2");
    int8_product(x, m, w, out, blocking(), int8_kernel(unit));
}

/// [`matmul_int8`] with the given blocking and tile kernel.
fn int8_product(x: &[f32], m: usize, w: &Int8Weights, out: &mut [f32], blocking: &Blocking, tile: TileKernel<Int8Tile>) {
    let (k, n) = (w.panels.k, w.panels.n);
    let inv = &w.inv_smooth;
    let exact = w.exact.as_ref().map_or(&[][..], |(channels, _)| channels);
    product(x, (m, k, n), tile.rows, out, |x, rows| quantize_rows(x, rows, k, inv, exact, tile.rows), |a, panel, out, ldc| {
        int8_panel(a, w, panel, out, ldc, blocking, tile)
    });
}

/// The dequantisation inputs of one tile (its rows × `NR`).
struct Dequant<'a> {
    row_scale: &'a [f32],
    row_zero: &'a [i32],
    col_scale: &'a [f32],
    col_sum: &'a [i32],
    /// The exact channels' share: `exact` values per row (tile rows × `exact`) and the panel of their
    /// f32 weight rows (`exact × NR`).
    exact: usize,
    exact_x: &'a [f32],
    exact_w: &'a [f32],
}

/// What an int8 tile kernel computes, [`kernel::int8_tile`] and [`int8_tile_reference`] alike:
/// `out[r·ldc + j] = f32(acc − zero[r]·sum[j]) · (row_scale[r] · col_scale[j])` where
/// `acc = Σ_p Σ_b a[r][p].byte(b) · b[p][j].byte(b)` (u8 × i8, wrapping int32), then for each
/// exact channel `c` in order `out ← fma(exact_x[r][c], exact_w[c][j], out)` — for a panel's
/// last depth slice; before it, `acc` itself (its bits), from which the next slice goes on.
type Int8Tile = fn(&[u32], &[u32], usize, &mut [f32], usize, usize, Slice, &Dequant<'_>);

fn int8_panel(a: &Quantized, w: &Int8Weights, panel: usize, out: &mut [f32], ldc: usize, blocking: &Blocking, kernel: TileKernel<Int8Tile>) {
    let mr = kernel.rows;
    let depth = w.panels.depth;
    let lanes = &w.panels.panels[panel * depth * NR..(panel + 1) * depth * NR];
    let cols = panel * NR..(panel + 1) * NR;
    let (exact, exact_w) = match &w.exact {
        Some((channels, rows)) => (channels.len(), &rows.panels[panel * channels.len() * NR..(panel + 1) * channels.len() * NR]),
        None => (0, &[][..]),
    };
    let width = NR.min(w.panels.n - panel * NR);
    tiles_of_panel(a.rows, width, depth, blocking, (mr, kernel.step), out, ldc, |index, valid, range, slice, out, ldc| {
        let rows = index * mr..(index + 1) * mr;
        let dequant = Dequant {
            row_scale: &a.scale[rows.clone()],
            row_zero: &a.zero[rows.clone()],
            col_scale: &w.scale[cols.clone()],
            col_sum: &w.sum[cols.clone()],
            exact,
            exact_x: &a.exact[rows.start * exact..rows.end * exact],
            exact_w,
        };
        let a = &a.lanes[index * mr * depth..(index + 1) * mr * depth];
        (kernel.run)(&a[range.start..], &lanes[range.start * NR..], range.len(), out, ldc, valid, slice, &dequant)
    });
}

/// The int8 tile in plain scalar Rust: the same integer arithmetic and the same f32 operations
/// as the VNNI kernel, so the two agree bit for bit.
#[cfg_attr(not(test), allow(dead_code))]
#[allow(clippy::too_many_arguments)]
fn int8_tile_reference(a: &[u32], b: &[u32], depth: usize, out: &mut [f32], ldc: usize, rows: usize, slice: Slice, d: &Dequant<'_>) {
    for r in 0..rows {
        for j in 0..NR {
            let mut acc = if slice.first { 0 } else { out[r * ldc + j].to_bits() as i32 };
            for p in 0..depth {
                let (x, w) = (a[r * slice.lda + p].to_le_bytes(), b[p * NR + j].to_le_bytes());
                for byte in 0..4 {
                    acc = acc.wrapping_add(i32::from(x[byte]) * i32::from(w[byte] as i8));
                }
            }
            if !slice.last {
                out[r * ldc + j] = f32::from_bits(acc as u32);
                continue;
            }
            let corrected = acc.wrapping_sub(d.row_zero[r].wrapping_mul(d.col_sum[j]));
            let mut value = corrected as f32 * (d.row_scale[r] * d.col_scale[j]);
            for c in 0..d.exact {
                value = d.exact_x[r * d.exact + c].mul_add(d.exact_w[c * NR + j], value);
            }
            out[r * ldc + j] = value;
        }
    }
}

mod blocking;
mod packed;
mod unit;

pub(crate) use packed::{Layout, Packed};
use packed::{Interleaved, STEP_LANES, STRIP, STRIPS};

/// The f32, bf16 and int8 products with a chosen blocking and unit, for `examples/bench_dense`.
#[doc(hidden)]
pub mod bench;

#[cfg(target_arch = "x86_64")]
mod kernel;

#[cfg(not(target_arch = "x86_64"))]
mod kernel {
    use super::Slice;

    #[allow(clippy::too_many_arguments)]
    pub(super) fn int8_tile(_: &[u32], _: &[u32], _: usize, _: &mut [f32], _: usize, _: usize, _: Slice, _: &super::Dequant<'_>) {
        unreachable!("int8_supported() is false off x86-64")
    }

    pub(super) fn f32_tile(_: &[f32], _: &[f32], _: usize, _: &mut [f32], _: usize, _: usize, _: Slice) {
        unreachable!("avx512_supported() is false off x86-64")
    }

    pub(super) fn fma_rounds(_: usize) -> (f64, f32) {
        unreachable!("no FMA vectors of ours off x86-64")
    }

    pub(super) fn vnni_rounds(_: usize, _: i8) -> (f64, i32) {
        unreachable!("vnni_supported() is false off x86-64")
    }

    pub(super) fn dpbf16_rounds(_: usize, _: f32, _: f32) -> (f64, f32) {
        unreachable!("bf16_supported() is false off x86-64")
    }

    pub(super) mod avx2_f32 {
        #[allow(clippy::too_many_arguments)]
        pub(in super::super) fn f32_tile(_: &[f32], _: &[f32], _: usize, _: std::ops::Range<usize>, _: &mut [f32], _: usize, _: usize, _: super::super::Slice) {
            unreachable!("no AVX2 off x86-64")
        }

        pub(in super::super) fn f32_rows_tile(_: &[f32], _: &[f32], _: usize, _: &mut [f32], _: usize, _: usize, _: super::super::Slice) {
            unreachable!("no AVX2 off x86-64")
        }

        pub(in super::super) fn interleave(_: &[&[f32]], _: usize, _: &mut [f32]) {
            unreachable!("no AVX2 off x86-64")
        }
    }

    pub(super) fn bf16_tile(_: &[u32], _: &[u32], _: usize, _: &mut [f32], _: usize, _: usize, _: Slice) {
        unreachable!("bf16_supported() is false off x86-64")
    }

    pub(super) fn quantize_row(_: &[f32], _: &[f32], _: &mut [u32]) -> (f32, i32) {
        unreachable!("int8_supported() is false off x86-64")
    }

    pub(super) mod avx2 {
        pub(in super::super) fn quantize_row(_: &[f32], _: &[f32], _: &mut [u32]) -> (f32, i32) {
            unreachable!("no AVX2 off x86-64")
        }

        #[allow(clippy::too_many_arguments)]
        pub(in super::super) fn int8_tile(_: &[u32], _: &[u32], _: usize, _: &mut [f32], _: usize, _: usize, _: super::super::Slice, _: &super::super::Dequant<'_>) {
            unreachable!("no AVX2 off x86-64")
        }

        pub(in super::super) fn madd_rounds(_: usize) -> (f64, i32) {
            unreachable!("no AVX2 off x86-64")
        }
    }

    pub(super) mod amx {
        use super::super::Slice;

        pub(in super::super) const ROWS: usize = 32;
        pub(in super::super) const STEP: usize = 16;

        #[allow(dead_code)] // unit.rs reads CPUID's AMX bits on x86-64 only
        pub(in super::super) fn request_tile_data() -> bool {
            false
        }

        pub(in super::super) fn bf16_tile(_: &[u32], _: &[u32], _: usize, _: &mut [f32], _: usize, _: usize, _: Slice) {
            unreachable!("no AMX off x86-64")
        }

        #[allow(clippy::too_many_arguments)]
        pub(in super::super) fn int8_tile(_: &[u32], _: &[u32], _: usize, _: &mut [f32], _: usize, _: usize, _: Slice, _: &super::super::Dequant<'_>) {
            unreachable!("no AMX off x86-64")
        }
    }
}

#[cfg(test)]
mod tests;
