use super::*;

/// A `(k, n)` weight matrix packed for each f32 kernel this CPU has (AVX-512's rows, AVX2's
/// strips), rounded to bf16 where it has AVX-512 BF16, quantised (plain: no smoothing, no
/// exact channels) where it has an int8 kernel, and row-major for gemm.
pub struct Weights {
    rows: Option<Packed<f32>>,
    strips: Option<Packed<f32>>,
    bf16: Option<Packed<u32>>,
    int8: Option<Int8Weights>,
    plain: Vec<f32>,
    k: usize,
    n: usize,
}

pub fn pack(w: &[f32], k: usize, n: usize) -> Weights {
    let rows = avx512_supported().then(|| Packed::f32_for(w, k, n, Unit::Avx512));
    let strips = avx2_supported().then(|| Packed::f32_for(w, k, n, Unit::Avx2));
    let any = || rows.as_ref().or(strips.as_ref()).expect("an f32 kernel");
    let bf16 = bf16_supported().then(|| Packed::bf16(any()));
    let int8 = int8_supported().then(|| Int8Weights::new(any(), None, &[]));
    Weights { rows, strips, bf16, int8, plain: w.to_vec(), k, n }
}

/// `out ← x · w` in f32 through gemm, as the encoder computes it on a CPU without AVX2.
pub fn gemm_f32(x: &[f32], m: usize, w: &Weights, out: &mut [f32]) {
    use crate::inference::strided::{MatMut, MatRef, matmul_parallel};
    let (k, n) = (w.k, w.n);
    matmul_parallel(MatRef::new(x, m, k, k, 1), MatRef::new(&w.plain, k, n, n, 1), MatMut::new(out, m, n, n), 1.0);
}

/// The f32 FMA rate the CPU issues on `pool`'s threads at once (GFLOP/s): every thread runs
/// register-only FMA chains on its widest vectors for about `seconds`; the product kernels'
/// limit, which a GEMM's own rate need not be near.
pub fn fma_peak(pool: &rayon::ThreadPool, seconds: f64) -> f64 {
    issue_rate(pool, seconds, |rounds| kernel::fma_rounds(rounds).0)
}

/// The rate (GOP/s, two per multiply-add) at which this process's unit for `arithmetic`
/// issues its products' instructions on `pool`'s threads at once, register-only like
/// [`fma_peak`]: that unit's limit, measured. `None` for f32 (the FMA peak), AMX tiles (their
/// rate is the FMA peak's fixed multiple, bench/report.py) and a CPU without such a unit.
pub fn unit_peak(pool: &rayon::ThreadPool, arithmetic: Arithmetic, seconds: f64) -> Option<f64> {
    match (arithmetic, arithmetic.unit()?) {
        (Arithmetic::F32, _) => None,
        (Arithmetic::Int8, Unit::Avx512) => Some(issue_rate(pool, seconds, |rounds| kernel::vnni_rounds(rounds, 3).0)),
        // The `vpmaddwd` + `vpaddd` pair of AVX2's int8 kernel.
        (Arithmetic::Int8, Unit::Avx2) => Some(issue_rate(pool, seconds, |rounds| kernel::avx2::madd_rounds(rounds).0)),
        (Arithmetic::Bf16, Unit::Avx512) => Some(issue_rate(pool, seconds, |rounds| kernel::dpbf16_rounds(rounds, 1.0, 1e-3).0)),
        _ => None,
    }
}

/// Operations per second (G) of `probe(rounds)` (returning the operations it did) on every
/// thread of `pool` at once, for about `seconds`.
fn issue_rate(pool: &rayon::ThreadPool, seconds: f64, probe: impl Fn(usize) -> f64 + Sync) -> f64 {
    // Rounds for about `seconds`, from a timed warm-up of a million.
    const WARM_UP: usize = 1 << 20;
    let start = std::time::Instant::now();
    std::hint::black_box(probe(WARM_UP));
    let rounds = (WARM_UP as f64 * seconds / start.elapsed().as_secs_f64().max(1e-6)).ceil() as usize;
    let start = std::time::Instant::now();
    let ops: f64 = pool.broadcast(|_| std::hint::black_box(probe(rounds))).iter().sum();
    ops / start.elapsed().as_secs_f64() / 1e9
}

/// The arithmetic of a product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arithmetic {
    F32,
    Bf16,
    Int8,
}

impl Arithmetic {
    /// The unit this process computes it on ([`units`]), `None` where the CPU has none.
    pub fn unit(self) -> Option<Unit> {
        match self {
            Self::F32 => units().f32,
            Self::Bf16 => units().bf16,
            Self::Int8 => units().int8,
        }
    }
}

/// `out ← x · w` in f32, or with bf16 inputs, on this process's unit (`None` where the CPU
/// has no kernel for it).
pub fn product(x: &[f32], m: usize, w: &Weights, out: &mut [f32], bf16: bool, blocking: &Blocking) -> Option<()> {
    let arithmetic = if bf16 { Arithmetic::Bf16 } else { Arithmetic::F32 };
    product_on(x, m, w, out, arithmetic, arithmetic.unit()?, blocking)
}

/// `out ← x · w` in `arithmetic` on `unit`; `None` where the CPU cannot run it there.
pub fn product_on(x: &[f32], m: usize, w: &Weights, out: &mut [f32], arithmetic: Arithmetic, unit: Unit, blocking: &Blocking) -> Option<()> {
    if !runs(arithmetic, unit) {
        return None;
    }
    match (arithmetic, unit) {
        (Arithmetic::F32, Unit::Avx512) => f32_product(x, m, w.rows.as_ref()?, out, blocking),
        (Arithmetic::F32, _) => f32_product(x, m, w.strips.as_ref()?, out, blocking),
        (Arithmetic::Bf16, _) => bf16_product(x, m, w.bf16.as_ref()?, out, blocking, bf16_kernel(unit)),
        (Arithmetic::Int8, _) => int8_product(x, m, w.int8.as_ref()?, out, blocking, int8_kernel(unit)),
    }
    Some(())
}

/// Whether this CPU runs `arithmetic` on `unit` (AMX only where [`units`] chose it: Linux
/// may refuse its state).
fn runs(arithmetic: Arithmetic, unit: Unit) -> bool {
    match (unit, arithmetic) {
        (Unit::Avx512, Arithmetic::F32) => avx512_supported(),
        (Unit::Avx512, Arithmetic::Bf16) => bf16_supported(),
        (Unit::Avx512, Arithmetic::Int8) => vnni_supported(),
        (Unit::Amx, Arithmetic::Bf16 | Arithmetic::Int8) => arithmetic.unit() == Some(Unit::Amx),
        (Unit::Avx2, Arithmetic::F32 | Arithmetic::Int8) => avx2_supported(),
        (Unit::Amx, Arithmetic::F32) | (Unit::Avx2, Arithmetic::Bf16) => false,
    }
}
