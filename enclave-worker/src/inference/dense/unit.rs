//! Which unit runs each product: AVX-512 (`vfmadd231ps`, `vdpbf16ps`, `vpdpbusd`) or, where the
//! CPU has them and Linux grants their state, the AMX tiles for bf16 and int8 (`tdpbf16ps`,
//! `tdpbusd`); f32 and int8 on a CPU without AVX-512 run on AVX2 (`vfmadd231ps` on 8 lanes,
//! `vpmaddwd`), with the same bits. Chosen once per process, at the first product (the engine
//! asks at start-up), like the blocking.
//!
//! AMX needs both: CPUID's `amx_tile` with `amx_bf16` (resp. `amx_int8`), and the kernel's
//! permission for the tile data (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`),
//! without which the first tile instruction faults. The AMX kernels also use AVX-512 for what
//! is not a product (the int8 activations' quantisation, dequantising), so they are chosen only
//! where the AVX-512 kernel of the same precision would run too.

use std::sync::OnceLock;

/// The instructions a product's tile kernel runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// AVX-512 vectors, 6 rows × 64 columns a tile.
    Avx512,
    /// AMX tiles, 32 rows × 64 columns a tile.
    Amx,
    /// AVX2 vectors (f32, and int8 as `vpmaddwd` on operands widened to i16), 6 rows × 64
    /// columns a tile, where the CPU has no AVX-512 (for int8: no AVX-512 VNNI).
    Avx2,
}

impl Unit {
    /// As the benchmark and the worker's log name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Avx512 => "avx512",
            Self::Amx => "amx",
            Self::Avx2 => "avx2",
        }
    }
}

/// The units of this process's products (`None`: no kernel of ours runs the precision here; f32
/// then runs on gemm's kernels). AMX has no f32 product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Units {
    pub f32: Option<Unit>,
    pub bf16: Option<Unit>,
    pub int8: Option<Unit>,
}

/// What this CPU reports, and whether Linux granted the tile state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Amx {
    pub tile: bool,
    pub bf16: bool,
    pub int8: bool,
    pub granted: bool,
}

impl Amx {
    /// CPUID leaf 7's AMX bits; the permission is asked for only when the CPU has tiles.
    fn of_this_cpu() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let features = raw_cpuid::CpuId::new().get_extended_feature_info();
            let has = |f: fn(&raw_cpuid::ExtendedFeatures) -> bool| features.as_ref().is_some_and(f);
            let tile = has(raw_cpuid::ExtendedFeatures::has_amx_tile);
            Self {
                tile,
                bf16: has(raw_cpuid::ExtendedFeatures::has_amx_bf16),
                int8: has(raw_cpuid::ExtendedFeatures::has_amx_int8),
                granted: tile && super::kernel::amx::request_tile_data(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Self { tile: false, bf16: false, int8: false, granted: false }
        }
    }

    /// The units, given what the AVX-512 kernels can run (f32, bf16, int8) and whether the CPU
    /// has AVX2 with FMA (the last resort of f32 and int8).
    fn units(self, [f32_avx512, bf16_avx512, int8_avx512]: [bool; 3], avx2: bool) -> Units {
        let usable = self.tile && self.granted;
        let pick = |avx512: bool, amx: bool| avx512.then_some(if usable && amx { Unit::Amx } else { Unit::Avx512 });
        let avx2 = avx2.then_some(Unit::Avx2);
        Units { f32: pick(f32_avx512, false).or(avx2), bf16: pick(bf16_avx512, self.bf16), int8: pick(int8_avx512, self.int8).or(avx2) }
    }
}

/// This CPU's AMX, read (and the tile state requested) once.
pub(crate) fn amx() -> &'static Amx {
    static AMX: OnceLock<Amx> = OnceLock::new();
    AMX.get_or_init(Amx::of_this_cpu)
}

/// This process's units.
pub fn units() -> &'static Units {
    static UNITS: OnceLock<Units> = OnceLock::new();
    UNITS.get_or_init(|| amx().units([super::avx512_supported(), super::bf16_supported(), super::vnni_supported()], super::avx2_supported()))
}

/// Whether this process's bf16 products outrun its f32 ones, so that int8 jobs compute what
/// int8 cannot hold (attention, the FFN outputs kept wider, short texts) in bf16 rather than
/// f32, and jobs of either reduced precision run attention in bf16. AMX tiles do (bf16 1.84× our
/// fp32 end to end, Emerald Rapids), and AVX-512 BF16 in AMD's cores (1.6× on Zen 4, 1.7× on
/// Zen 5). Intel's cores without usable tiles issue `vdpbf16ps` slower than the f32 FMAs it
/// stands for: on Emerald Rapids under a hypervisor that hides AMX, the bf16 products ran at
/// 0.65× the f32 ones' GFLOP/s and bf16 jobs at 0.68× fp32's docs/s.
pub fn bf16_pays() -> bool {
    static PAYS: OnceLock<bool> = OnceLock::new();
    *PAYS.get_or_init(|| bf16_pays_on(units().bf16, amd()))
}

fn bf16_pays_on(bf16: Option<Unit>, amd: bool) -> bool {
    match bf16 {
        Some(Unit::Amx) => true,
        Some(Unit::Avx512) => amd,
        Some(Unit::Avx2) | None => false,
    }
}

/// Whether CPUID names AMD as this CPU's vendor.
fn amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        raw_cpuid::CpuId::new().get_vendor_info().is_some_and(|v| v.as_str() == "AuthenticAMD")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: Amx = Amx { tile: true, bf16: true, int8: true, granted: true };

    #[test]
    fn amx_only_with_the_tile_state_granted() {
        let (amx, avx512) = (Some(Unit::Amx), Some(Unit::Avx512));
        assert_eq!(ALL.units([true; 3], true), Units { f32: avx512, bf16: amx, int8: amx });
        // Linux refused (or predates) the tile state: the first tile instruction would fault.
        let refused = Amx { granted: false, ..ALL };
        assert_eq!(refused.units([true; 3], true), Units { f32: avx512, bf16: avx512, int8: avx512 });
        // One of the two products on tiles.
        let int8_only = Amx { bf16: false, ..ALL };
        assert_eq!(int8_only.units([true; 3], true), Units { f32: avx512, bf16: avx512, int8: amx });
    }

    #[test]
    fn no_amx_without_the_avx512_kernels_it_leans_on() {
        assert_eq!(ALL.units([false; 3], false), Units { f32: None, bf16: None, int8: None });
        assert_eq!(ALL.units([true, true, false], false), Units { f32: Some(Unit::Avx512), bf16: Some(Unit::Amx), int8: None });
    }

    #[test]
    fn f32_and_int8_fall_back_to_avx2_and_bf16_does_not() {
        let none = Amx { tile: false, bf16: false, int8: false, granted: false };
        let (avx2, avx512) = (Some(Unit::Avx2), Some(Unit::Avx512));
        assert_eq!(none.units([false; 3], true), Units { f32: avx2, bf16: None, int8: avx2 });
        // AMX's int8 leans on the VNNI code; AVX2 alone does not bring it in.
        assert_eq!(ALL.units([false; 3], true), Units { f32: avx2, bf16: None, int8: avx2 });
        assert_eq!(none.units([true; 3], true), Units { f32: avx512, bf16: avx512, int8: avx512 });
        // AVX-512 F without VNNI (Skylake): f32 on AVX-512, int8 on AVX2.
        assert_eq!(none.units([true, false, false], true), Units { f32: avx512, bf16: None, int8: avx2 });
    }

    #[test]
    fn bf16_pays_on_tiles_and_on_amd_cores_only() {
        for amd in [false, true] {
            assert!(bf16_pays_on(Some(Unit::Amx), amd));
            assert_eq!(bf16_pays_on(Some(Unit::Avx512), amd), amd);
            assert!(!bf16_pays_on(None, amd));
        }
    }

    #[test]
    fn the_choice_matches_cpuid() {
        let (amx, units) = (amx(), units());
        eprintln!("this CPU: {amx:?} → {units:?}");
        if !(amx.tile && amx.granted) {
            assert_ne!(units.bf16, Some(Unit::Amx));
            assert_ne!(units.int8, Some(Unit::Amx));
        }
        assert_ne!(units.f32, Some(Unit::Amx), "AMX has no f32 product");
        eprintln!("bf16 pays: {}", bf16_pays());
        assert!(!bf16_pays() || units.bf16.is_some(), "bf16 cannot pay without a bf16 kernel");
    }
}
