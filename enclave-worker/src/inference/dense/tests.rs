use super::*;

/// A deterministic pseudo-random stream in [-1, 1).
fn values(seed: u64, len: usize) -> Vec<f32> {
    let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..len)
        .map(|_| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `x · w` in f64 after `round` is applied to every input.
fn reference(x: &[f32], w: &[f32], m: usize, k: usize, n: usize, round: impl Fn(f32) -> f64) -> Vec<f64> {
    let mut out = vec![0f64; m * n];
    for i in 0..m {
        for p in 0..k {
            let a = round(x[i * k + p]);
            for j in 0..n {
                out[i * n + j] += a * round(w[p * n + j]);
            }
        }
    }
    out
}

/// Every shape class: tile and panel edges, odd depth, a single row, the encoder's shapes, the
/// three ways of splitting the work on two threads (by MC rows from MC·threads rows on, by a
/// share of the rows per thread below that, by panels when a share is under MIN_TASK_ROWS).
const SHAPES: [(usize, usize, usize); 8] =
    [(1, 2, 1), (5, 7, 13), (6, 64, 64), (7, 383, 65), (97, 384, 1152), (200, 1536, 384), (13, 1, 130), (203, 7, 70)];

/// Runs `product` on every shape and compares with the f64 product of the inputs as `round`
/// sees them, within f32 summation error.
fn check_shapes(product: impl Fn(&[f32], usize, &[f32], usize, usize, &mut [f32]), round: impl Fn(f32) -> f64 + Copy) {
    for (seed, &(m, k, n)) in SHAPES.iter().enumerate() {
        let x = values(seed as u64, m * k);
        let w = values(100 + seed as u64, k * n);
        let mut out = vec![f32::NAN; m * n];
        product(&x, m, &w, k, n, &mut out);
        let want = reference(&x, &w, m, k, n, round);
        // f32 accumulation of k products of magnitude ≤ 1: error ≲ k · 2^-24 · |sum terms|.
        let bound = k as f64 * 1.2e-7 + 1e-6;
        for (i, (&got, &want)) in out.iter().zip(&want).enumerate() {
            assert!((f64::from(got) - want).abs() <= bound, "({m},{k},{n}) [{i}]: {got} vs {want}");
        }
    }
}

#[test]
fn rounding_is_to_nearest_even() {
    assert_eq!(bf16_value(bf16_bits(1.0)), 1.0);
    // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
    assert_eq!(bf16_value(bf16_bits(1.0 + 1.0 / 256.0)), 1.0);
    // 1 + 3·2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
    assert_eq!(bf16_value(bf16_bits(1.0 + 3.0 / 256.0)), 1.0 + 1.0 / 64.0);
    assert_eq!(bf16_value(bf16_bits(-2.5)), -2.5);
    let x = 0.123_456_79f32;
    assert!(((bf16_value(bf16_bits(x)) - x) / x).abs() <= 1.0 / 256.0);
}

/// The f32 kernels this CPU runs, each with the unit it packs for.
fn f32_kernels_here() -> Vec<(&'static str, Unit)> {
    let mut kernels = Vec::new();
    if avx512_supported() {
        kernels.push(("AVX-512", Unit::Avx512));
    }
    if avx2_supported() {
        kernels.push(("AVX2", Unit::Avx2));
    }
    if kernels.len() < 2 {
        eprintln!("f32 kernels here: {:?} (the others need instructions this CPU lacks)", kernels.iter().map(|k| k.0).collect::<Vec<_>>());
    }
    kernels
}

#[test]
fn f32_matches_the_exact_product() {
    for (_, unit) in f32_kernels_here() {
        check_shapes(|x, m, w, k, n, out| matmul_f32(x, m, &Packed::f32_for(w, k, n, unit), out), f64::from);
    }
}

/// Every f32 kernel gives the bits of one definition, whichever CPU it runs on: per output, the
/// chain `acc ← fma(x[i][p], w[p][j], acc)` from zero, `p` ascending.
#[test]
fn f32_kernels_equal_the_fma_chain_bit_for_bit() {
    for (name, unit) in f32_kernels_here() {
        for (seed, &(m, k, n)) in SHAPES.iter().enumerate() {
            let x = values(seed as u64, m * k);
            let w = values(100 + seed as u64, k * n);
            let mut out = vec![f32::NAN; m * n];
            matmul_f32(&x, m, &Packed::f32_for(&w, k, n, unit), &mut out);
            for (i, row) in out.chunks_exact(n).enumerate() {
                for (j, &got) in row.iter().enumerate() {
                    let want = (0..k).fold(0f32, |acc, p| x[i * k + p].mul_add(w[p * n + j], acc));
                    assert!(got.to_bits() == want.to_bits(), "{name} ({m},{k},{n}) [{i}, {j}]: {got} vs {want}");
                }
            }
        }
    }
}

/// Attention's tile on a row-major panel ([`f32_tile`]), on every kernel here: the FMA chain's
/// bits, from zero and from the sums already in `out`, and no row past `rows` written.
#[test]
fn f32_tiles_of_row_major_panels_equal_the_fma_chain() {
    let mut kernels: Vec<(&str, Tile<f32>)> = Vec::new();
    if avx512_supported() {
        kernels.push(("AVX-512", kernel::f32_tile));
    }
    if avx2_supported() {
        kernels.push(("AVX2", kernel::avx2_f32::f32_rows_tile));
    }
    for (name, run) in kernels {
        for (seed, &(rows, depth, lda)) in [(1, 1, 1), (6, 64, 64), (3, 7, 9), (5, 300, 301)].iter().enumerate() {
            let a = values(seed as u64, (MR - 1) * lda + depth);
            let b = values(50 + seed as u64, depth * NR);
            let ldc = NR + 3;
            let before = values(90 + seed as u64, MR * ldc);
            for accumulate in [false, true] {
                let mut out = before.clone();
                run(&a, &b, depth, &mut out, ldc, rows, Slice { lda, first: !accumulate, last: true });
                for (r, (got, before)) in out.chunks(ldc).zip(before.chunks(ldc)).enumerate() {
                    for j in 0..NR {
                        let from = if accumulate { before[j] } else { 0.0 };
                        let chain = (0..depth).fold(from, |acc, p| a[r * lda + p].mul_add(b[p * NR + j], acc));
                        let want = if r < rows { chain } else { before[j] };
                        assert!(got[j].to_bits() == want.to_bits(), "{name} rows {rows} depth {depth} [{r}, {j}]: {} vs {want}", got[j]);
                    }
                }
            }
        }
    }
}

/// The AVX2 kernel's interleaved activations hold each row's value of step `p` at
/// `p·STEP_LANES + r` of its tile and zeros elsewhere, on ragged rows and depths (the vector
/// transpose and the scalar steps after it).
#[test]
fn interleaved_tiles_hold_the_rows_step_by_step() {
    if !avx2_supported() {
        eprintln!("skipped: this CPU has no AVX2");
        return;
    }
    for (seed, &(rows, k)) in [(1, 1), (6, 8), (7, 9), (13, 16), (5, 23), (12, 40)].iter().enumerate() {
        let x = values(seed as u64, rows * k);
        let interleaved = Interleaved::of(&x, rows, k);
        for index in 0..rows.div_ceil(MR) {
            let tile = interleaved.tile(index, 0);
            assert_eq!(tile.len(), k * STEP_LANES);
            for p in 0..k {
                for r in 0..STEP_LANES {
                    let row = index * MR + r;
                    let want = if r < MR && row < rows { x[row * k + p] } else { 0.0 };
                    assert_eq!(tile[p * STEP_LANES + r].to_bits(), want.to_bits(), "{rows} × {k}: tile {index}, step {p}, row {r}");
                }
            }
            assert_eq!(interleaved.tile(index, k / 2), &tile[k / 2 * STEP_LANES..]);
        }
    }
}

/// The strips the AVX2 kernel reads hold the same matrix as the rows the AVX-512 kernel reads.
#[test]
fn both_layouts_hold_the_same_matrix() {
    let (k, n) = (37, 150);
    let w = values(7, k * n);
    let rows = Packed::f32_in(&w, k, n, Layout::Rows);
    let strips = Packed::f32_in(&w, k, n, Layout::Strips);
    assert_ne!(rows.panels, strips.panels, "different orders");
    for row in 0..k + 1 {
        for col in 0..n + 70 {
            let want = if row < k && col < n { w[row * n + col] } else { 0.0 };
            assert_eq!((rows.value(row, col), strips.value(row, col)), (want, want), "[{row}, {col}]");
        }
    }
}

#[test]
fn bf16_matches_the_rounded_product() {
    if !bf16_supported() {
        eprintln!("skipped: this CPU has no AVX-512 BF16");
        return;
    }
    let round = |v: f32| f64::from(bf16_value(bf16_bits(v)));
    check_shapes(|x, m, w, k, n, out| bf16_product(x, m, &Packed::bf16(&Packed::f32(w, k, n)), out, blocking(), BF16_AVX512), round);
}

#[test]
fn bf16_stays_close_to_full_precision() {
    if !bf16_supported() {
        eprintln!("skipped: this CPU has no AVX-512 BF16");
        return;
    }
    let (m, k, n) = (33, 384, 256);
    let x = values(7, m * k);
    let w = values(8, k * n);
    let mut out = vec![0f32; m * n];
    matmul_bf16(&x, m, &Packed::bf16(&Packed::f32(&w, k, n)), &mut out);
    let exact = reference(&x, &w, m, k, n, f64::from);
    for i in 0..m {
        let (exact, got) = (&exact[i * n..(i + 1) * n], &out[i * n..(i + 1) * n]);
        let dot: f64 = exact.iter().zip(got).map(|(a, &b)| a * f64::from(b)).sum();
        let norms = exact.iter().map(|a| a * a).sum::<f64>().sqrt()
            * got.iter().map(|&b| f64::from(b).powi(2)).sum::<f64>().sqrt();
        assert!(dot / norms > 0.9999, "row {i}: cosine {}", dot / norms);
    }
}

/// The int8 product written out plainly from its definition: weights quantised per column,
/// rows per row (by `quantize_row_plain`), integer sums, the same dequantisation formula.
fn int8_plain(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut scale = vec![1f32; n];
    for (j, scale) in scale.iter_mut().enumerate() {
        let max = (0..k).map(|p| w[p * n + j].abs()).fold(0f32, f32::max);
        if max > 0.0 {
            *scale = max / 127.0;
        }
    }
    let q = |p: usize, j: usize| (w[p * n + j] / scale[j]).round_ties_even().clamp(-127.0, 127.0) as i32;
    let mut out = vec![0f32; m * n];
    let mut bytes = vec![0u8; k];
    for i in 0..m {
        let (row_scale, zero) = quantize_row_plain(&x[i * k..(i + 1) * k], &vec![1.0; k], &mut bytes);
        for j in 0..n {
            let (mut acc, mut sum) = (0i32, 0i32);
            for (p, &b) in bytes.iter().enumerate() {
                acc += i32::from(b) * q(p, j);
                sum += q(p, j);
            }
            out[i * n + j] = (acc - zero * sum) as f32 * (row_scale * scale[j]);
        }
    }
    out
}

/// int8 shapes: k not a multiple of 4 (ragged quads), n not a multiple of 64 (narrow last
/// panel), m not a multiple of 6 (padded last tile), both ways of splitting the work.
const INT8_SHAPES: [(usize, usize, usize); 10] = [
    (1, 1, 1),
    (1, 3, 5),
    (5, 7, 13),
    (6, 64, 64),
    (7, 383, 65),
    (13, 1, 130),
    (97, 384, 1152),
    (203, 7, 70),
    (200, 1536, 384),
    (250, 385, 129),
];

/// The scalar int8 tile as a kernel of `MR` rows.
const INT8_REFERENCE: TileKernel<Int8Tile> = TileKernel { rows: MR, step: 1, run: int8_tile_reference };

/// Depth slices of 5 lanes: the scalar references run panel after panel in slices, so the
/// kernels (one slice for these shapes) are checked against a sliced computation too.
const THIN: Blocking = Blocking { l2: L2Size(0), measured: false, depth_slice: 5 };

/// Inputs with an offset and the occasional outlier, as real activations have.
fn activations(seed: u64, m: usize, k: usize) -> Vec<f32> {
    values(seed, m * k).iter().enumerate().map(|(i, &v)| if i % 97 == 5 { 8.0 * v } else { v + 0.3 }).collect()
}

/// The int8 tile kernels this CPU runs besides the scalar reference (AMX's have their own tests).
fn int8_kernels_here() -> Vec<(&'static str, TileKernel<Int8Tile>)> {
    let mut kernels = Vec::new();
    if vnni_supported() {
        kernels.push(("VNNI", INT8_VNNI));
    }
    if avx2_supported() {
        kernels.push(("AVX2", INT8_AVX2));
    }
    if kernels.is_empty() {
        eprintln!("skipped: this CPU has neither AVX-512 VNNI nor AVX2");
    }
    kernels
}

#[test]
fn int8_kernels_equal_the_scalar_reference_bit_for_bit() {
    for (name, kernel) in int8_kernels_here() {
        for (seed, &(m, k, n)) in INT8_SHAPES.iter().enumerate() {
            let x = activations(seed as u64, m, k);
            let w = values(100 + seed as u64, k * n);
            let weights = Int8Weights::new(&Packed::f32(&w, k, n), None, &[]);
            let (mut got, mut reference) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
            int8_product(&x, m, &weights, &mut got, blocking(), kernel);
            int8_product(&x, m, &weights, &mut reference, &THIN, INT8_REFERENCE);
            let plain = int8_plain(&x, &w, m, k, n);
            for (i, ((a, b), c)) in got.iter().zip(&reference).zip(&plain).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{name} ({m},{k},{n}) [{i}]: kernel {a} vs tile reference {b}");
                assert_eq!(a.to_bits(), c.to_bits(), "{name} ({m},{k},{n}) [{i}]: kernel {a} vs plain reference {c}");
            }
        }
    }
}

/// Sums that only an int32 accumulator holds: activations quantised to 255 and weights to ±127
/// along a depth of 16,384, 255 · 127 · 16,383 = 530,563,455 in the even columns, its negation
/// in the odd (a kernel that saturated an i16 pair sum, as `vpmaddubsw` does, would fail).
#[test]
fn int8_kernels_keep_the_extreme_sums() {
    let (m, k, n) = (7, 16_384, 70);
    let x: Vec<f32> = (0..m * k).map(|i| if i % k == 0 { -1.0 } else { 254.0 }).collect();
    let w: Vec<f32> = (0..k * n).map(|i| if i % n % 2 == 0 { 1.0 } else { -1.0 }).collect();
    let weights = Int8Weights::new(&Packed::f32(&w, k, n), None, &[]);
    let mut reference = vec![f32::NAN; m * n];
    int8_product(&x, m, &weights, &mut reference, blocking(), INT8_REFERENCE);
    for (name, kernel) in int8_kernels_here() {
        let mut got = vec![f32::NAN; m * n];
        int8_product(&x, m, &weights, &mut got, blocking(), kernel);
        for (i, (a, b)) in got.iter().zip(&reference).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{name} [{i}]: kernel {a} vs tile reference {b}");
        }
    }
    // And the reference is the product: 254 · (k − 1) − 1 in the even columns, within int8's step.
    let want = 254.0 * (k - 1) as f32 - 1.0;
    assert!((reference[0] - want).abs() <= want * 1e-3, "{} vs {want}", reference[0]);
    assert!((reference[1] + want).abs() <= want * 1e-3, "{} vs {}", reference[1], -want);
}

/// The AVX2 int8 kernel's issue-rate probe does the arithmetic it counts: its chains' sum equals
/// the same `vpmaddwd` + `vpaddd` chains computed on integers (every lane and chain alike).
#[test]
fn the_int8_avx2_probe_runs_its_multiply_adds() {
    if !avx2_supported() {
        eprintln!("skipped: this CPU has no AVX2");
        return;
    }
    let rounds = 1_000;
    let mut lane = 1i32;
    for _ in 0..rounds {
        // `vpmaddwd` of the lane's two i16 halves with (3, 3), then `vpaddd`.
        let [lo, hi] = [lane as i16, (lane >> 16) as i16].map(i32::from);
        lane = lane.wrapping_add(3 * lo + 3 * hi);
    }
    let (ops, sum) = kernel::avx2::madd_rounds(rounds);
    assert_eq!(ops, (rounds * 12 * 16 * 2) as f64);
    assert_eq!(sum, lane.wrapping_mul(12 * 8));
}

/// The VNNI issue-rate probe does the arithmetic it counts: its chains' sum equals the same
/// `vpdpbusd` chains computed on integers (each lane's four bytes as u8 times `y`, added to the
/// lane), every lane and chain alike; a `y` of 0 adds nothing.
#[test]
fn the_vnni_probe_runs_its_multiply_adds() {
    if !vnni_supported() {
        eprintln!("skipped: this CPU has no AVX-512 VNNI");
        return;
    }
    let rounds = 1_000;
    for y in [3i8, -5, 0] {
        let mut lane = 1i32;
        for _ in 0..rounds {
            let bytes = lane.to_le_bytes().map(|b| i32::from(b) * i32::from(y));
            lane = lane.wrapping_add(bytes.iter().sum::<i32>());
        }
        let (ops, sum) = kernel::vnni_rounds(rounds, y);
        assert_eq!(ops, (rounds * 12 * 64 * 2) as f64);
        assert_eq!(sum, lane.wrapping_mul(12 * 16), "y = {y}");
    }
}

/// The bf16 issue-rate probe does the arithmetic it counts: each instruction adds `2·x·y` to every
/// lane (exact here: powers of two), so the sum is `12 · 16 · (1 + rounds · 2xy)`.
#[test]
fn the_bf16_probe_runs_its_multiply_adds() {
    if !bf16_supported() {
        eprintln!("skipped: this CPU has no AVX-512 BF16");
        return;
    }
    let rounds = 1_000;
    let (ops, sum) = kernel::dpbf16_rounds(rounds, 0.5, 1.0 / 1024.0);
    assert_eq!(ops, (rounds * 12 * 32 * 2) as f64);
    assert_eq!(sum, 12.0 * 16.0 * (1.0 + rounds as f32 / 1024.0));
}

#[test]
fn int8_tile_reference_matches_the_plain_product_anywhere() {
    // The scalar tile runs on every CPU, so packing and dequantisation are checked even
    // where the VNNI kernel cannot run.
    for (seed, &(m, k, n)) in INT8_SHAPES.iter().enumerate().take(6) {
        let x = activations(seed as u64, m, k);
        let w = values(100 + seed as u64, k * n);
        let weights = Int8Weights::new(&Packed::f32(&w, k, n), None, &[]);
        let mut reference = vec![f32::NAN; m * n];
        int8_product(&x, m, &weights, &mut reference, &THIN, INT8_REFERENCE);
        let plain = int8_plain(&x, &w, m, k, n);
        for (i, (a, b)) in reference.iter().zip(&plain).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "({m},{k},{n}) [{i}]: {a} vs {b}");
        }
    }
}

#[test]
fn int8_stays_close_to_full_precision_and_smoothing_is_exact_in_f32() {
    if !int8_supported() {
        eprintln!("skipped: this CPU has neither AVX-512 VNNI nor AVX2");
        return;
    }
    let (m, k, n) = (33, 384, 256);
    let x = activations(7, m, k);
    let w = values(8, k * n);
    let exact = reference(&x, &w, m, k, n, f64::from);
    // Smoothing factors that flatten the outlier channels are a change of basis: same product.
    let smooth: Vec<f32> = (0..k).map(|p| if p % 7 == 3 { 2.5 } else { 0.75 }).collect();
    for smooth in [None, Some(&smooth[..])] {
        let mut out = vec![0f32; m * n];
        matmul_int8(&x, m, &Int8Weights::new(&Packed::f32(&w, k, n), smooth, &[]), &mut out);
        for i in 0..m {
            let (exact, got) = (&exact[i * n..(i + 1) * n], &out[i * n..(i + 1) * n]);
            let dot: f64 = exact.iter().zip(got).map(|(a, &b)| a * f64::from(b)).sum();
            let norms = exact.iter().map(|a| a * a).sum::<f64>().sqrt()
                * got.iter().map(|&b| f64::from(b).powi(2)).sum::<f64>().sqrt();
            assert!(dot / norms > 0.999, "row {i}: cosine {}", dot / norms);
        }
    }
}

/// The quantisation kernel equals the plain definition byte for byte, on lengths around the
/// vector width, with and without smoothing, on rows of one sign, zeros, an infinity and a NaN;
/// it writes the row's bytes and nothing past them.
#[test]
fn int8_quantisation_kernel_matches_its_definition() {
    let mut kernels: Vec<(&str, QuantizeRow)> = Vec::new();
    if vnni_supported() {
        kernels.push(("AVX-512", kernel::quantize_row));
    }
    if avx2_supported() {
        kernels.push(("AVX2", kernel::avx2::quantize_row));
    }
    if kernels.is_empty() {
        eprintln!("skipped: this CPU has neither AVX-512 VNNI nor AVX2");
    }
    let mut rows: Vec<Vec<f32>> = [1, 3, 15, 16, 17, 31, 33, 384, 1537].iter().map(|&k| values(k as u64, k)).collect();
    rows.push(values(7, 40).iter().map(|v| v.abs() + 0.1).collect());
    rows.push(values(8, 40).iter().map(|v| -v.abs() * 1e-3).collect());
    rows.push(vec![0.0; 21]);
    rows.push([values(9, 20), vec![f32::INFINITY]].concat());
    rows.push([values(10, 20), vec![f32::NAN], values(11, 5)].concat());
    // Rounding ties: with range 255 and zero 0, these land exactly on .5 before rounding.
    rows.push(vec![0.5, 1.5, 2.5, 254.5, 255.0, 0.0]);
    for ((name, quantize_row), row) in kernels.iter().flat_map(|kernel| rows.iter().map(move |row| (kernel, row))) {
        let k = row.len();
        let factors: Vec<f32> = values(k as u64 + 99, k).iter().map(|v| (v * 4.0).exp2()).collect();
        for inv_smooth in [vec![1.0; k], factors] {
            let mut want = vec![0u8; k];
            let want_mapping = quantize_row_plain(row, &inv_smooth, &mut want);
            // Lanes prefilled with a marker: the padding bytes past `k` must keep it.
            let mut lanes = vec![0xA5A5_A5A5u32; k.div_ceil(4)];
            let got_mapping = quantize_row(row, &inv_smooth, &mut lanes);
            let got: Vec<u8> = lanes.iter().flat_map(|l| l.to_le_bytes()).collect();
            assert_eq!(&got[..k], &want[..], "{name}, k = {k}");
            assert!(got[k..].iter().all(|&b| b == 0xA5), "{name}, k = {k}: wrote past the row");
            assert_eq!(got_mapping.1, want_mapping.1, "{name}, k = {k}: zero point");
            assert!(got_mapping.0 == want_mapping.0 || (got_mapping.0.is_nan() && want_mapping.0.is_nan()), "{name}, k = {k}: scale");
        }
    }
}

#[test]
fn int8_rows_quantise_within_half_a_step() {
    let row = [-1.0f32, 0.0, 0.5, 3.0, 2.999, -0.25];
    let mut bytes = [0u8; 6];
    let (scale, zero) = quantize_row_plain(&row, &[1.0; 6], &mut bytes);
    assert_eq!(scale, 4.0 / 255.0);
    for (&v, &b) in row.iter().zip(&bytes) {
        assert!((scale * (i32::from(b) - zero) as f32 - v).abs() <= scale / 2.0 + 1e-6, "{v} → {b}");
    }
    assert_eq!(i32::from(bytes[1]), zero, "zero is exact");
    assert_eq!(quantize_row_plain(&[0.0; 5], &[1.0; 5], &mut [7u8; 5]), (1.0, 0));
    let mut positive = [0u8; 3];
    assert_eq!(quantize_row_plain(&[1.0, 2.0, 0.5], &[1.0; 3], &mut positive).1, 0);
    assert_eq!(positive[1], 255);
}

/// Every fifth input channel, at most eight: the exact ones of an int8 test product.
fn some_channels(k: usize) -> Vec<usize> {
    (0..k).step_by(5).take(8).collect()
}

#[test]
fn int8_with_exact_channels_equals_its_references_on_odd_shapes() {
    // Tile reference: the same path bit for bit. Plain: the int8 part with the exact channels
    // left out (rows zero, activations zeroed before quantising) plus their f32 share, summed
    // in another order, so within f32 rounding.
    for (seed, &(m, k, n)) in INT8_SHAPES.iter().enumerate() {
        let x = activations(seed as u64, m, k);
        let w = values(100 + seed as u64, k * n);
        let exact = some_channels(k);
        let weights = Int8Weights::new(&Packed::f32(&w, k, n), None, &exact);
        let mut reference = vec![f32::NAN; m * n];
        int8_product(&x, m, &weights, &mut reference, &THIN, INT8_REFERENCE);
        let kept = |p: usize| !exact.contains(&p);
        let x_int8: Vec<f32> = x.iter().enumerate().map(|(i, &v)| if kept(i % k) { v } else { 0.0 }).collect();
        let w_int8: Vec<f32> = w.iter().enumerate().map(|(i, &v)| if kept(i / n) { v } else { 0.0 }).collect();
        let mut plain = int8_plain(&x_int8, &w_int8, m, k, n);
        for i in 0..m {
            for j in 0..n {
                plain[i * n + j] += exact.iter().map(|&c| x[i * k + c] * w[c * n + j]).sum::<f32>();
            }
        }
        for (i, (a, b)) in reference.iter().zip(&plain).enumerate() {
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "({m},{k},{n}) [{i}]: {a} vs {b}");
        }
        for (name, kernel) in int8_kernels_here() {
            let mut got = vec![f32::NAN; m * n];
            int8_product(&x, m, &weights, &mut got, blocking(), kernel);
            for (i, (a, b)) in got.iter().zip(&reference).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{name} ({m},{k},{n}) [{i}]: kernel {a} vs tile reference {b}");
            }
        }
    }
}

#[test]
fn an_outlier_in_an_exact_channel_does_not_coarsen_its_row() {
    if !int8_supported() {
        eprintln!("skipped: this CPU has neither AVX-512 VNNI nor AVX2");
        return;
    }
    // One channel 300× the others (what a model's outlier dimension looks like): quantised with
    // its row, it takes the whole u8 range and every other channel rounds to a few levels.
    let (m, k, n) = (24, 384, 128);
    let outlier = 17;
    let x: Vec<f32> = values(11, m * k).iter().enumerate().map(|(i, &v)| if i % k == outlier { 300.0 } else { v }).collect();
    let w = values(12, k * n);
    let exact = reference(&x, &w, m, k, n, f64::from);
    let worst = |weights: &Int8Weights| {
        let mut out = vec![0f32; m * n];
        matmul_int8(&x, m, weights, &mut out);
        (0..m)
            .map(|i| {
                let (e, g) = (&exact[i * n..(i + 1) * n], &out[i * n..(i + 1) * n]);
                let err: f64 = e.iter().zip(g).map(|(a, &b)| (a - f64::from(b)).powi(2)).sum::<f64>().sqrt();
                err / e.iter().map(|a| a * a).sum::<f64>().sqrt()
            })
            .fold(0f64, f64::max)
    };
    let packed = Packed::f32(&w, k, n);
    let (plain, split) = (worst(&Int8Weights::new(&packed, None, &[])), worst(&Int8Weights::new(&packed, None, &[outlier])));
    eprintln!("worst relative error of a row: {plain:.5} plain, {split:.5} with the outlier channel exact");
    assert!(plain > 0.01, "the outlier should ruin the plain int8 row (relative error {plain})");
    assert!(split < 0.01, "with the outlier channel exact, relative error {split}");
}

#[test]
fn every_blocking_gives_the_same_bits() {
    // Slicing the depth only moves where the sums wait between slices (registers or the output),
    // never their order: every product must come out bit for bit the same. Depth 1 is a slice
    // per step; a slice as deep as the panel is no slicing.
    let blockings = [1, 5, 64, 100_000].map(|depth_slice| Blocking { l2: L2Size(0), measured: false, depth_slice });
    for (seed, &(m, k, n)) in SHAPES.iter().chain(&INT8_SHAPES).enumerate() {
        let x = activations(seed as u64, m, k);
        let w = values(100 + seed as u64, k * n);
        let (rows, strips) = (Packed::f32_in(&w, k, n, Layout::Rows), Packed::f32_in(&w, k, n, Layout::Strips));
        let bf16 = Packed::bf16(&rows);
        let int8 = Int8Weights::new(&strips, None, &some_channels(k));
        let outputs = |blocking: &Blocking| {
            let mut out = [(); 6].map(|_| vec![f32::NAN; m * n]);
            int8_product(&x, m, &int8, &mut out[0], blocking, INT8_REFERENCE);
            if avx512_supported() {
                f32_product(&x, m, &rows, &mut out[1], blocking);
            }
            if avx2_supported() {
                f32_product(&x, m, &strips, &mut out[5], blocking);
            }
            if bf16_supported() {
                bf16_product(&x, m, &bf16, &mut out[2], blocking, BF16_AVX512);
            }
            if vnni_supported() {
                int8_product(&x, m, &int8, &mut out[3], blocking, INT8_VNNI);
            }
            if avx2_supported() {
                int8_product(&x, m, &int8, &mut out[4], blocking, INT8_AVX2);
            }
            out.map(|values| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
        };
        let whole = outputs(&blockings[3]);
        for blocking in &blockings[..3] {
            for (product, (got, want)) in ["int8 reference", "f32 AVX-512", "bf16", "int8 VNNI", "int8 AVX2", "f32 AVX2"].iter().zip(outputs(blocking).iter().zip(&whole)) {
                assert!(got == want, "({m},{k},{n}) {product}, slices of {}: not the unsliced bits", blocking.depth_slice);
            }
        }
    }
}

#[test]
fn slices_cover_the_depth_evenly() {
    for depth_slice in [0, 1, 3, 64, 2048] {
        let blocking = Blocking { l2: L2Size(0), measured: false, depth_slice };
        for depth in [0, 1, 2, 63, 64, 65, 383, 1536, 4096, 4097] {
            let slices: Vec<_> = blocking.slices(depth).collect();
            // A slice of 0 lanes (a hand-made blocking) is taken as 1.
            assert_eq!(slices.len(), depth.div_ceil(depth_slice.max(1)).max(1), "depth {depth} in slices of {depth_slice}");
            assert_eq!((slices[0].start, slices.last().unwrap().end), (0, depth));
            assert!(slices.windows(2).all(|two| two[0].end == two[1].start));
            let lengths = slices.iter().map(|slice| slice.len());
            let (shortest, longest) = (lengths.clone().min().unwrap(), lengths.max().unwrap());
            assert!(longest <= depth_slice.max(1) && longest - shortest <= 1, "depth {depth} in slices of {depth_slice}: {slices:?}");
        }
    }
}

#[test]
fn the_slice_follows_the_l2_size() {
    const KIB: usize = 1 << 10;
    // Half of L2 for the panel's slice, 256 bytes a lane row: Zen 4 and 5 (1 MiB per core),
    // Emerald Rapids (2 MiB), one shared by a hyper-thread pair, and a tiny cache.
    for (l2, depth_slice) in [(1024 * KIB, 2048), (2048 * KIB, 4096), (512 * KIB, 1024), (16 * KIB, 64)] {
        assert_eq!(Blocking::for_l2(L2Size(l2), true).depth_slice, depth_slice, "L2 of {} KiB", l2 / KIB);
    }
    // all-MiniLM-L6-v2's deepest panel (the f32 FFN output, 1,536 lanes) is one slice with a
    // whole L2 of 1 or 2 MiB; BERT-large's (4,096) is cut where it would fill L2.
    for (l2, slices) in [(512 * KIB, 2), (1024 * KIB, 1), (2048 * KIB, 1)] {
        assert_eq!(Blocking::for_l2(L2Size(l2), true).slices(1536).count(), slices, "L2 of {} KiB", l2 / KIB);
    }
    assert_eq!(Blocking::for_l2(L2Size(1024 * KIB), true).slices(4096).count(), 2);
    if let Some(L2Size(bytes)) = L2Size::of_this_cpu() {
        assert!((128 * KIB..=64 * 1024 * KIB).contains(&bytes), "CPUID's L2 of {bytes} bytes per thread");
    }
}

// ---------------------------------------------------------------------------------------------
// AMX: the tile kernels against the scalar references, where this CPU has AMX and Linux grants
// the tile state; elsewhere skipped, saying so.

/// Whether the AMX kernel of a product can run here; prints why not.
fn amx_runs(product: &str, unit: Option<Unit>) -> bool {
    let runs = unit == Some(Unit::Amx);
    if !runs {
        eprintln!("skipped: no AMX {product} here ({:?}, units {:?})", unit::amx(), units());
    }
    runs
}

/// Shapes ragged for the 32-row, 16-lane-step, 64-column AMX tile: rows 1, 31, 33, 95, 97;
/// depths short of, past and between whole steps (int8: 64 k a step; bf16: 32); a narrow
/// last panel; and the encoder's shapes (whole steps), both ways of splitting the work.
const AMX_SHAPES: [(usize, usize, usize); 10] = [
    (1, 1, 1),
    (31, 63, 65),
    (33, 65, 64),
    (32, 64, 64),
    (5, 129, 130),
    (95, 31, 200),
    (97, 384, 1152),
    (200, 1536, 384),
    (250, 385, 129),
    (64, 1000, 70),
];

#[test]
fn amx_int8_kernel_equals_the_scalar_reference_bit_for_bit() {
    if !amx_runs("INT8", units().int8) {
        return;
    }
    for (seed, &(m, k, n)) in AMX_SHAPES.iter().chain(&INT8_SHAPES).enumerate() {
        let x = activations(seed as u64, m, k);
        let w = values(100 + seed as u64, k * n);
        for exact in [vec![], some_channels(k)] {
            let weights = Int8Weights::new(&Packed::f32(&w, k, n), None, &exact);
            let (mut amx, mut reference) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
            int8_product(&x, m, &weights, &mut amx, blocking(), INT8_AMX);
            int8_product(&x, m, &weights, &mut reference, &THIN, INT8_REFERENCE);
            for (i, (a, b)) in amx.iter().zip(&reference).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "({m},{k},{n}), {} exact: [{i}] AMX {a} vs reference {b}", exact.len());
            }
            if exact.is_empty() {
                let plain = int8_plain(&x, &w, m, k, n);
                for (i, (a, c)) in amx.iter().zip(&plain).enumerate() {
                    assert_eq!(a.to_bits(), c.to_bits(), "({m},{k},{n}) [{i}]: AMX {a} vs plain reference {c}");
                }
            }
        }
    }
}

#[test]
fn amx_bf16_matches_the_rounded_product() {
    // Not bit for bit: `tdpbf16ps` does not add its 32 products one by one in f32 as
    // `vdpbf16ps` does (measured on Emerald Rapids: about a third of the sums differ from the
    // AVX-512 kernel's, by a few ulps, and lie closer to the exact sum of the rounded inputs).
    // So the same bound as the AVX-512 kernel: f32 summation error of k terms.
    if !amx_runs("BF16", units().bf16) {
        return;
    }
    let round = |v: f32| f64::from(bf16_value(bf16_bits(v)));
    let amx = |x: &[f32], m, w: &[f32], k, n, out: &mut [f32]| {
        bf16_product(x, m, &Packed::bf16(&Packed::f32(w, k, n)), out, blocking(), BF16_AMX)
    };
    check_shapes(amx, round);
    for (seed, &(m, k, n)) in AMX_SHAPES.iter().enumerate() {
        let x = values(seed as u64, m * k);
        let w = values(100 + seed as u64, k * n);
        let mut out = vec![f32::NAN; m * n];
        amx(&x, m, &w, k, n, &mut out);
        let want = reference(&x, &w, m, k, n, round);
        let bound = k as f64 * 1.2e-7 + 1e-6;
        for (i, (&got, &want)) in out.iter().zip(&want).enumerate() {
            assert!((f64::from(got) - want).abs() <= bound, "({m},{k},{n}) [{i}]: AMX {got} vs {want}");
        }
    }
}

#[test]
fn amx_kernels_give_the_same_bits_for_every_blocking() {
    // Slices begin at whole steps of the tile kernel, so every blocking groups the products of
    // each `tdpbf16ps` alike and the sums wait in the output as f32 (int8: int32 bits).
    let (bf16_amx, int8_amx) = (units().bf16 == Some(Unit::Amx), units().int8 == Some(Unit::Amx));
    if !bf16_amx && !int8_amx {
        amx_runs("BF16 or INT8", None);
        return;
    }
    let blockings = [1, 5, 17, 64, 100_000].map(|depth_slice| Blocking { l2: L2Size(0), measured: false, depth_slice });
    for (seed, &(m, k, n)) in AMX_SHAPES.iter().enumerate() {
        let x = activations(seed as u64, m, k);
        let w = Packed::f32(&values(100 + seed as u64, k * n), k, n);
        let (bf16, int8) = (Packed::bf16(&w), Int8Weights::new(&w, None, &some_channels(k)));
        let outputs = |blocking: &Blocking| {
            let mut out = [(); 2].map(|_| vec![f32::NAN; m * n]);
            if bf16_amx {
                bf16_product(&x, m, &bf16, &mut out[0], blocking, BF16_AMX);
            }
            if int8_amx {
                int8_product(&x, m, &int8, &mut out[1], blocking, INT8_AMX);
            }
            out.map(|values| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
        };
        let whole = outputs(&blockings[4]);
        for blocking in &blockings[..4] {
            for (product, (got, want)) in ["bf16", "int8"].iter().zip(outputs(blocking).iter().zip(&whole)) {
                assert!(got == want, "({m},{k},{n}) AMX {product}, slices of {}: not the unsliced bits", blocking.depth_slice);
            }
        }
    }
}

#[test]
fn slices_in_steps_begin_at_whole_steps() {
    for (depth_slice, step) in [(0, 16), (1, 16), (5, 16), (17, 16), (64, 16), (2048, 16), (5, 1)] {
        let blocking = Blocking { l2: L2Size(0), measured: false, depth_slice };
        for depth in [0, 1, 15, 16, 17, 63, 64, 65, 383, 1536, 4097] {
            let slices: Vec<_> = blocking.slices_in_steps(depth, step).collect();
            assert_eq!((slices[0].start, slices.last().unwrap().end), (0, depth));
            assert!(slices.windows(2).all(|two| two[0].end == two[1].start && two[0].end % step == 0));
            assert!(slices.iter().all(|s| !s.is_empty() || depth == 0), "depth {depth}, {depth_slice}/{step}: {slices:?}");
            // As few slices as the slice depth (rounded down to whole steps, at least one) allows.
            let most = (depth_slice / step).max(1) * step;
            assert_eq!(slices.len(), depth.div_ceil(step).div_ceil(most / step).max(1), "depth {depth}, {depth_slice}/{step}");
        }
    }
}
