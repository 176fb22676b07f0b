//! Matrix products on views into slices (a row stride and a column stride each), through gemm's
//! kernels: attention multiplies each head's Q, K and V where they lie in the QKV product's rows
//! and writes each head's context straight into its columns of the layer's context, without
//! copying any of them out or back.
//!
//! gemm takes raw pointers and strides; this module checks, before it calls it, that every
//! element of each view lies inside its slice and that no two elements of the output view are
//! the same value, so the rest of the crate stays free of `unsafe`.
#![allow(unsafe_code)]

/// `rows × cols` values of a slice, `(r, c)` at `r · row_stride + c · col_stride`.
#[derive(Clone, Copy)]
pub(crate) struct MatRef<'a> {
    values: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

/// A writable view: rows of `cols` consecutive values, `row_stride` apart.
pub(crate) struct MatMut<'a> {
    values: &'a mut [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
}

/// Whether the last element of the view lies inside `len` values.
fn fits(len: usize, rows: usize, cols: usize, row_stride: usize, col_stride: usize) -> bool {
    rows == 0 || cols == 0 || (rows - 1) * row_stride + (cols - 1) * col_stride < len
}

impl<'a> MatRef<'a> {
    /// Panics if the view reaches past `values`.
    pub(crate) fn new(values: &'a [f32], rows: usize, cols: usize, row_stride: usize, col_stride: usize) -> Self {
        assert!(fits(values.len(), rows, cols, row_stride, col_stride), "view outside its slice");
        Self { values, rows, cols, row_stride, col_stride }
    }

    /// The transposed view (no copy).
    pub(crate) fn t(self) -> Self {
        Self { rows: self.cols, cols: self.rows, row_stride: self.col_stride, col_stride: self.row_stride, ..self }
    }
}

impl<'a> MatMut<'a> {
    /// Panics if the view reaches past `values` or its rows overlap (`row_stride < cols`).
    pub(crate) fn new(values: &'a mut [f32], rows: usize, cols: usize, row_stride: usize) -> Self {
        assert!(rows <= 1 || row_stride >= cols, "rows of the output view overlap");
        assert!(fits(values.len(), rows, cols, row_stride, 1), "view outside its slice");
        Self { values, rows, cols, row_stride }
    }
}

impl MatMut<'_> {
    /// The same view, borrowed again (to write it more than once).
    pub(crate) fn reborrow(&mut self) -> MatMut<'_> {
        MatMut { values: &mut *self.values, rows: self.rows, cols: self.cols, row_stride: self.row_stride }
    }

    /// Rows `start..end` of the view, borrowed (a block of queries' outputs).
    pub(crate) fn rows(&mut self, start: usize, end: usize) -> MatMut<'_> {
        assert!(start <= end && end <= self.rows, "rows outside the view");
        let offset = (start * self.row_stride).min(self.values.len());
        MatMut { values: &mut self.values[offset..], rows: end - start, cols: self.cols, row_stride: self.row_stride }
    }

    /// Row `r` of the view.
    pub(crate) fn row(&mut self, r: usize) -> &mut [f32] {
        assert!(r < self.rows, "row outside the view");
        &mut self.values[r * self.row_stride..r * self.row_stride + self.cols]
    }

    /// Divides row `r` by `divisors[r]`.
    pub(crate) fn scale_rows(&mut self, divisors: &[f32]) {
        assert_eq!(divisors.len(), self.rows, "one divisor per row");
        for (r, &divisor) in divisors.iter().enumerate() {
            let inv = 1.0 / divisor;
            for v in &mut self.values[r * self.row_stride..r * self.row_stride + self.cols] {
                *v *= inv;
            }
        }
    }
}

/// `out ← scale · (a · b)` in f32 on the calling thread (callers parallelise over their own tasks).
///
/// Panics if the shapes do not match.
pub(crate) fn matmul(a: MatRef<'_>, b: MatRef<'_>, out: MatMut<'_>, scale: f32) {
    product(a, b, out, scale, gemm::Parallelism::None);
}

/// [`matmul`] split into tasks on the current rayon pool: one product as large as a layer's.
pub(crate) fn matmul_parallel(a: MatRef<'_>, b: MatRef<'_>, out: MatMut<'_>, scale: f32) {
    product(a, b, out, scale, gemm::Parallelism::Rayon(rayon::current_num_threads()));
}

fn product(a: MatRef<'_>, b: MatRef<'_>, out: MatMut<'_>, scale: f32, parallelism: gemm::Parallelism) {
    assert!(a.cols == b.rows && out.rows == a.rows && out.cols == b.cols, "shapes do not match");
    if out.rows == 0 || out.cols == 0 {
        return;
    }
    let stride = |s: usize| isize::try_from(s).expect("stride fits isize");
    // SAFETY: every element gemm reads, `(r, c)` of `a` and `b` for r < rows and c < cols, lies
    // inside its slice (checked by `MatRef::new`, and `t` swaps rows with strides together), and
    // every element it writes lies inside `out`'s slice, each at a distinct place (`MatMut::new`);
    // the shared slices cannot alias the exclusive one. `read_dst` is false: gemm only writes.
    unsafe {
        gemm::gemm(
            out.rows,
            out.cols,
            a.cols,
            out.values.as_mut_ptr(),
            1,
            stride(out.row_stride),
            false,
            a.values.as_ptr(),
            stride(a.col_stride),
            stride(a.row_stride),
            b.values.as_ptr(),
            stride(b.col_stride),
            stride(b.row_stride),
            0.0,
            scale,
            false,
            false,
            false,
            parallelism,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_views_multiply_like_the_definition() {
        // a: 3×4 in the even columns of a 3×9 block; b = cᵀ with c 5×4 stored with row stride 6.
        let block: Vec<f32> = (0..27).map(|i| (i as f32 * 0.37).sin()).collect();
        let stored: Vec<f32> = (0..30).map(|i| (i as f32 * 0.11).cos()).collect();
        let a = MatRef::new(&block, 3, 4, 9, 2);
        let b = MatRef::new(&stored, 5, 4, 6, 1).t();
        let mut out = [7f32; 3 * 8];
        matmul(a, b, MatMut::new(&mut out[1..], 3, 5, 8), 0.5);
        for r in 0..3 {
            for c in 0..8 {
                let got = out[r * 8 + c];
                if (1..6).contains(&c) {
                    let want: f32 = (0..4).map(|p| block[r * 9 + 2 * p] * stored[(c - 1) * 6 + p]).sum::<f32>() * 0.5;
                    assert!((got - want).abs() < 1e-5, "({r}, {c}): {got} vs {want}");
                } else {
                    assert_eq!(got, 7.0, "({r}, {c}) is outside the view and was written");
                }
            }
        }
    }

    #[test]
    fn scale_rows_divides_only_the_view() {
        let mut values = vec![6f32; 10];
        MatMut::new(&mut values[1..], 2, 3, 5).scale_rows(&[2.0, 3.0]);
        assert_eq!(values, [6.0, 3.0, 3.0, 3.0, 6.0, 6.0, 2.0, 2.0, 2.0, 6.0]);
    }

    #[test]
    #[should_panic(expected = "view outside its slice")]
    fn a_view_past_its_slice_is_refused() {
        MatRef::new(&[0.0; 11], 3, 4, 4, 1);
    }

    #[test]
    #[should_panic(expected = "rows of the output view overlap")]
    fn overlapping_output_rows_are_refused() {
        MatMut::new(&mut [0.0; 16], 3, 4, 3);
    }
}
