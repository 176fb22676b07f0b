//! The AMX tile kernels (bf16: `tdpbf16ps`; int8: `tdpbusd`, u8 activations × i8 weights as
//! `vpdpbusd` takes them) and Linux's permission for the tile state. Rust has no stable AMX
//! intrinsics, so the tile instructions are `asm!`.
//!
//! A kernel call computes one depth slice of a [`ROWS`] × `NR` tile of the product from the
//! same operands as the AVX-512 kernels: the activations' rows (`lda` lanes apart, k-pairs or
//! k-quads as u32 lanes) and a weight panel (`NR` lanes a row). AMX's B operand wants exactly
//! the panel's layout (per row one k-pair or k-quad for each of 16 columns), so both load as
//! they are. The tiles: C = 4 accumulators of 16 rows × 16 columns (32 rows × 32 columns),
//! A = 2 of 16 rows × 16 lanes, B = 2 of 16 lanes × 16 columns; each half of the panel's 64
//! columns in turn, 16 lanes of depth per step. A depth that is not a multiple of 16 ends with a
//! step from zero-padded copies. Sums start from zero or from `out` (the slices before; int8:
//! their bits) and go back to `out`; int8 dequantises after the panel's last slice, with the
//! AVX-512 code of the VNNI kernel's arithmetic ([`super::dequantize_rows`]).
//!
//! The tile registers hold nothing across calls: each call loads the configuration once and
//! ends with `tilerelease`. Between the `asm!` blocks of one call only Rust code without AMX runs
//! (the compiler emits no tile instructions: no AMX target feature is enabled), and nothing in
//! the call can be interrupted by other tile code of this thread.

use std::arch::asm;

use super::super::{NR, Slice};

/// Rows of a tile.
pub(in super::super) const ROWS: usize = 32;
/// Lanes of depth per tile step: a row of an A tile (64 bytes).
pub(in super::super) const STEP: usize = 16;
/// Bytes between two rows of a weight panel.
const PANEL_ROW_BYTES: usize = NR * 4;

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: asks Linux for the AMX tile data
/// state for this process (every thread). True when granted; off Linux, false.
pub(in super::super) fn request_tile_data() -> bool {
    #[cfg(target_os = "linux")]
    {
        const SYS_ARCH_PRCTL: i64 = 158;
        const ARCH_REQ_XCOMP_PERM: u64 = 0x1023;
        const XFEATURE_XTILEDATA: u64 = 18;
        let result: i64;
        // SAFETY: the system call reads its two integer arguments and changes only the
        // process's permitted XSAVE features; `syscall` clobbers rcx and r11 (declared).
        unsafe {
            asm!(
                "syscall",
                inlateout("rax") SYS_ARCH_PRCTL => result,
                in("rdi") ARCH_REQ_XCOMP_PERM,
                in("rsi") XFEATURE_XTILEDATA,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        result == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// Palette 1, the 8 tiles each 16 rows of 64 bytes (`ldtilecfg`'s 64-byte operand).
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes_per_row: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: Config = Config {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    bytes_per_row: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// The checks a tile kernel relies on: `rows` of the tile's [`ROWS`] are real; `a` holds
/// `ROWS` rows of `depth` lanes, `lda` apart; `b` `depth × NR` lanes; `out` `rows` rows of
/// `NR` f32, `ldc` apart.
fn check(a: &[u32], b: &[u32], depth: usize, out: &[f32], ldc: usize, rows: usize, slice: Slice) {
    assert!((1..=ROWS).contains(&rows) && ldc >= NR && slice.lda >= depth);
    assert!(a.len() >= (ROWS - 1) * slice.lda + depth && b.len() >= depth * NR && out.len() >= (rows - 1) * ldc + NR);
}

/// Which tile product: bf16 pairs with f32 sums, or u8 × i8 quads with int32 sums.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Bf16,
    Int8,
}

pub(in super::super) fn bf16_tile(a: &[u32], b: &[u32], depth: usize, out: &mut [f32], ldc: usize, rows: usize, slice: Slice) {
    check(a, b, depth, out, ldc, rows, slice);
    assert!(super::super::unit::units().bf16 == Some(super::super::Unit::Amx), "no AMX BF16 granted");
    tile(Op::Bf16, a, b, depth, out, ldc, rows, slice);
}

#[allow(clippy::too_many_arguments)]
pub(in super::super) fn int8_tile(
    a: &[u32],
    b: &[u32],
    depth: usize,
    out: &mut [f32],
    ldc: usize,
    rows: usize,
    slice: Slice,
    d: &super::super::Dequant<'_>,
) {
    check(a, b, depth, out, ldc, rows, slice);
    assert!(super::super::unit::units().int8 == Some(super::super::Unit::Amx), "no AMX INT8 granted");
    tile(Op::Int8, a, b, depth, out, ldc, rows, slice);
    if slice.last {
        super::dequantize_rows(out, ldc, rows, d);
    }
}

/// The sums of one tile into `out` (f32, or int32 bits for int8), after the checks of `check`
/// and of the unit.
#[allow(clippy::too_many_arguments)]
fn tile(op: Op, a: &[u32], b: &[u32], depth: usize, out: &mut [f32], ldc: usize, rows: usize, slice: Slice) {
    // The sums go through a whole tile of memory: `out` itself when every row is real, else a
    // scratch tile whose real rows are copied in and out.
    let mut scratch = Vec::new();
    let (c, ldc_c) = if rows == ROWS {
        (&mut out[..(ROWS - 1) * ldc + NR], ldc)
    } else {
        scratch = vec![0f32; ROWS * NR];
        if !slice.first {
            for (to, from) in scratch.chunks_exact_mut(NR).zip(out.chunks(ldc)).take(rows) {
                to.copy_from_slice(&from[..NR]);
            }
        }
        (&mut scratch[..], NR)
    };
    let whole = depth / STEP * STEP;
    // The last partial step's operands, zero-padded to a whole step.
    let tail = (whole < depth).then(|| {
        let mut a_tail = vec![0u32; ROWS * STEP];
        for (r, to) in a_tail.chunks_exact_mut(STEP).enumerate() {
            to[..depth - whole].copy_from_slice(&a[r * slice.lda + whole..r * slice.lda + depth]);
        }
        let mut b_tail = vec![0u32; STEP * NR];
        b_tail[..(depth - whole) * NR].copy_from_slice(&b[whole * NR..depth * NR]);
        (a_tail, b_tail)
    });
    // SAFETY: AMX granted (the callers' unit checks).
    unsafe { configure(&CONFIG) };
    for half in 0..2 {
        let columns = half * 32;
        // SAFETY (every block below): the CPU has AMX-TILE and the product's AMX feature and
        // Linux granted the tile state (the callers' unit checks); the configuration loaded
        // above makes every tile 16 rows of 64 bytes, so each `tileloadd`/`tilestored` touches
        // 16 rows of 64 bytes from its base, stride apart:
        // - C: rows 0..32 of `c` (`ldc_c` f32 apart), columns `columns..columns + 32`:
        //   within `c`, which holds `(ROWS − 1)·ldc_c + NR` f32 (built above);
        // - A: rows 0..32 of `a` at lanes `s..s + 16` for each whole step `s + 16 ≤ depth ≤ lda`
        //   (`check`: `a` holds `(ROWS − 1)·lda + depth` lanes), or the padded copy, rows 16 lanes;
        // - B: panel rows `s..s + 16`, lanes `columns..columns + 32` of each: within `b`'s
        //   `depth × NR` lanes, or the padded copy's `STEP × NR`.
        unsafe {
            start(c.as_mut_ptr().add(columns), ldc_c * 4, slice.first);
            if whole > 0 {
                steps(op, a.as_ptr(), slice.lda * 4, b.as_ptr().add(columns), whole / STEP);
            }
            if let Some((a_tail, b_tail)) = &tail {
                steps(op, a_tail.as_ptr(), STEP * 4, b_tail.as_ptr().add(columns), 1);
            }
            finish(c.as_mut_ptr().add(columns), ldc_c * 4);
        }
    }
    // SAFETY: as for `configure`.
    unsafe { release() };
    if rows < ROWS {
        for (to, from) in out.chunks_mut(ldc).zip(scratch.chunks_exact(NR)).take(rows) {
            to[..NR].copy_from_slice(from);
        }
    }
}

/// Loads the tile configuration.
///
/// Safety: AMX granted.
#[inline(always)]
unsafe fn configure(config: &Config) {
    // SAFETY: the caller's contract; `ldtilecfg` reads the 64 bytes of `config`.
    unsafe { asm!("ldtilecfg [{config}]", config = in(reg) config, options(nostack, readonly)) };
}

/// Releases the tiles (their state back to its initial, unconfigured one).
///
/// Safety: AMX granted.
#[inline(always)]
unsafe fn release() {
    // SAFETY: the caller's contract.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// The accumulators tmm0..tmm3 (C rows 0–15 and 16–31, columns +0 and +16): zero, or from `c`
/// (`stride` bytes a row) unless `first`.
///
/// Safety: AMX granted and configured (`configure`); unless `first`, `c` readable for 32 rows
/// of 32 f32, `stride` apart.
#[inline(always)]
unsafe fn start(c: *mut f32, stride: usize, first: bool) {
    if first {
        // SAFETY: the caller's contract.
        unsafe { asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem)) };
    } else {
        // SAFETY: the caller's contract.
        unsafe {
            asm!(
                "tileloadd tmm0, [{c} + {stride}]",
                "tileloadd tmm1, [{c} + {stride} + 64]",
                "tileloadd tmm2, [{c16} + {stride}]",
                "tileloadd tmm3, [{c16} + {stride} + 64]",
                c = in(reg) c,
                c16 = in(reg) c.byte_add(16 * stride),
                stride = in(reg) stride,
                options(nostack, readonly),
            );
        }
    }
}

/// `steps` steps of 16 lanes of depth: A tiles from `a` (rows 0–15 and 16–31, `lda_bytes`
/// apart, 64 bytes further each step), B tiles from `b` (panel rows, columns +0 and +16,
/// `NR` lanes a row, 16 panel rows further each step).
///
/// Safety: AMX granted and configured; `steps ≥ 1`; every tile read
/// lies within the operands (see `tile`).
#[inline(always)]
unsafe fn steps(op: Op, a: *const u32, lda_bytes: usize, b: *const u32, steps: usize) {
    macro_rules! run {
        ($dp:literal) => {
            // SAFETY: the caller's contract.
            unsafe {
                asm!(
                    "2:",
                    "tileloadd tmm4, [{a} + {lda}]",
                    "tileloadd tmm6, [{b} + {ldb}]",
                    concat!($dp, " tmm0, tmm4, tmm6"),
                    "tileloadd tmm7, [{b} + {ldb} + 64]",
                    concat!($dp, " tmm1, tmm4, tmm7"),
                    "tileloadd tmm5, [{a16} + {lda}]",
                    concat!($dp, " tmm2, tmm5, tmm6"),
                    concat!($dp, " tmm3, tmm5, tmm7"),
                    "add {a}, 64",
                    "add {a16}, 64",
                    "add {b}, {b_step}",
                    "dec {n}",
                    "jnz 2b",
                    a = inout(reg) a => _,
                    a16 = inout(reg) a.byte_add(16 * lda_bytes) => _,
                    lda = in(reg) lda_bytes,
                    b = inout(reg) b => _,
                    ldb = in(reg) PANEL_ROW_BYTES,
                    b_step = in(reg) STEP * PANEL_ROW_BYTES,
                    n = inout(reg) steps => _,
                    options(nostack, readonly),
                );
            }
        };
    }
    match op {
        Op::Bf16 => run!("tdpbf16ps"),
        Op::Int8 => run!("tdpbusd"),
    }
}

/// Stores the accumulators to `c` (`stride` bytes a row).
///
/// Safety: AMX granted and configured; `c` writable for 32 rows of 32 f32, `stride` apart.
#[inline(always)]
unsafe fn finish(c: *mut f32, stride: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!(
            "tilestored [{c} + {stride}], tmm0",
            "tilestored [{c} + {stride} + 64], tmm1",
            "tilestored [{c16} + {stride}], tmm2",
            "tilestored [{c16} + {stride} + 64], tmm3",
            c = in(reg) c,
            c16 = in(reg) c.byte_add(16 * stride),
            stride = in(reg) stride,
            options(nostack),
        );
    }
}
