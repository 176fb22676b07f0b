#![forbid(unsafe_code)]
//! What the fuzz targets share: the fixed keys, documents and time they verify against
//! ([`fixed`]), the seed corpora built from those and from the project's fixtures ([`seeds`]),
//! and a deterministic way to cut an input into pieces ([`pieces`]).

/// The client's corpus reader, from its own small crate: the client-cli crate's whole tree
/// (AWS SDK, SQLite) would multiply the instrumented build's time (docs/fuzzing.md).
pub use batch_formats::corpus;
pub mod fixed;
pub mod records;
pub mod seeds;

/// Cuts `data` into consecutive pieces whose sizes are drawn from a short list (1 byte, a few
/// bytes, around a 64 KiB STREAM chunk) by a generator seeded from the data itself: the same
/// input is always cut the same way, so every crash reproduces, while different inputs put the
/// boundaries in different places. Streaming readers must give the same result as for one push.
pub fn pieces(data: &[u8]) -> Vec<&[u8]> {
    const SIZES: [usize; 12] = [1, 2, 3, 5, 8, 13, 31, 100, 1000, 4096, 65_536, 65_569];
    let mut state = data.len() as u64 ^ 0x9e37_79b9_7f4a_7c15;
    for &b in data.iter().rev().take(8) {
        state = (state << 8 | u64::from(b)) ^ (state >> 56);
    }
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let pick = state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 59;
        let size = SIZES[pick as usize % SIZES.len()].min(rest.len());
        let (head, tail) = rest.split_at(size);
        out.push(head);
        rest = tail;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::pieces;

    #[test]
    fn pieces_cover_the_input_in_order() {
        for len in [0usize, 1, 7, 100, 70_000] {
            let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let joined: Vec<u8> = pieces(&data).concat();
            assert_eq!(joined, data);
            assert_eq!(pieces(&data), pieces(&data));
        }
    }
}
