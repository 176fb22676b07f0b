//! Object names of a ledger in the C2SP tlog-tiles layout (c2sp.org/tlog-tiles), plus the
//! ledger's own objects beside it.
//!
//! ```text
//! <prefix>checkpoint                      latest signed checkpoint (replaced by compare-and-swap)
//! <prefix>tile/<L>/<N>[.p/<W>]            hash tiles: 256 (or W) hashes of level 8·L
//! <prefix>tile/entries/<N>[.p/<W>]        entry bundles: u16-BE length-prefixed receipts
//! <prefix>ephem/meta/<N>[.p/<W>]          per entry: attestation hash, append time, fields, chain hash
//! <prefix>ephem/attestations/<sha256>     attestation documents, once each
//! <prefix>ephem/checkpoints/<size>        every signed checkpoint, by tree size
//! <prefix>ephem/staging/<size>-<root>     what a commit adds, written before its checkpoint
//! ```
//!
//! Everything but `checkpoint` is written create-only and never changes. `<N>` is written in
//! 3-digit groups, all but the last prefixed with `x` (1234067 → `x001/x234/067`), so no name
//! is both a file and a directory.

/// Hashes (or entries) in a full tile.
pub const TILE_WIDTH: u64 = 256;
/// Tree levels covered by one tile level.
pub const TILE_HEIGHT: u8 = 8;

/// A tile coordinate: level `level` (0 = leaf hashes, `entries` use level 0 numbering),
/// index `index` within the level, `width` hashes (1..=256; below 256 is a partial tile).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TileId {
    pub level: u8,
    pub index: u64,
    pub width: u16,
}

impl TileId {
    /// The tree level of the hashes this tile holds.
    pub fn tree_level(&self) -> u8 {
        self.level * TILE_HEIGHT
    }

    pub fn is_partial(&self) -> bool {
        u64::from(self.width) < TILE_WIDTH
    }

    /// The first leaf-level position (at this tile's level) of its hashes.
    pub fn first(&self) -> u64 {
        self.index * TILE_WIDTH
    }
}

/// The tiles (at every level) that a tree of `size` leaves has: full tiles below the
/// right edge, then one partial tile per level where the width is not a multiple of 256.
/// Only those with index `>= from_index(level)` are returned, so a caller can ask for the
/// tiles a commit changed.
pub fn tiles_of(size: u64, changed_since: u64) -> Vec<TileId> {
    let mut out = Vec::new();
    let mut level = 0u8;
    loop {
        let shift = u32::from(level) * u32::from(TILE_HEIGHT);
        if shift >= 64 {
            break;
        }
        let hashes = size >> shift; // complete subtrees of height 8·level
        if hashes == 0 {
            break;
        }
        let old = changed_since >> shift;
        for index in (old / TILE_WIDTH)..=((hashes - 1) / TILE_WIDTH) {
            let width = (hashes - index * TILE_WIDTH).min(TILE_WIDTH);
            let old_width = old.saturating_sub(index * TILE_WIDTH).min(TILE_WIDTH);
            if width > old_width {
                out.push(TileId { level, index, width: width as u16 });
            }
        }
        level += 1;
    }
    out
}

/// The entry bundles of leaves `[from, to)` as they are published for a tree of size `to`:
/// full bundles, then a partial one.
pub fn bundles_of(to: u64, changed_since: u64) -> Vec<TileId> {
    tiles_of(to, changed_since).into_iter().filter(|t| t.level == 0).collect()
}

/// Object names under one prefix (`""` for a bucket of its own).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    prefix: String,
}

impl Layout {
    /// `prefix` is empty or ends with `/`.
    pub fn new(prefix: &str) -> Self {
        let mut prefix = prefix.to_owned();
        if !prefix.is_empty() && !prefix.ends_with('/') {
            prefix.push('/');
        }
        Self { prefix }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn checkpoint(&self) -> String {
        format!("{}checkpoint", self.prefix)
    }

    pub fn tile(&self, t: TileId) -> String {
        format!("{}tile/{}/{}", self.prefix, t.level, coordinate(t))
    }

    pub fn entries(&self, t: TileId) -> String {
        format!("{}tile/entries/{}", self.prefix, coordinate(t))
    }

    pub fn meta(&self, t: TileId) -> String {
        format!("{}ephem/meta/{}", self.prefix, coordinate(t))
    }

    pub fn tiles_prefix(&self) -> String {
        format!("{}tile/", self.prefix)
    }

    pub fn attestation(&self, sha256: &[u8; 32]) -> String {
        format!("{}ephem/attestations/{}", self.prefix, hex::encode(sha256))
    }

    pub fn archived_checkpoint(&self, size: u64) -> String {
        format!("{}{}{size}", self.prefix, ARCHIVE)
    }

    pub fn archive_prefix(&self) -> String {
        format!("{}{ARCHIVE}", self.prefix)
    }

    /// The size named by an archived checkpoint's key.
    pub fn archived_size(&self, key: &str) -> Option<u64> {
        let digits = key.strip_prefix(&self.prefix)?.strip_prefix(ARCHIVE)?;
        canonical_decimal(digits)
    }

    pub fn staging(&self, size: u64, root: &[u8; 32]) -> String {
        format!("{}ephem/staging/{size}-{}", self.prefix, hex::encode(root))
    }

    /// What a key under `tile/` names: a hash tile or an entry bundle.
    pub fn parse_tile_key(&self, key: &str) -> Option<TileKey> {
        let rest = key.strip_prefix(&self.prefix)?.strip_prefix("tile/")?;
        let (kind, rest) = rest.split_once('/')?;
        let (number, width) = match rest.split_once(".p/") {
            Some((n, w)) => {
                let w = canonical_decimal(w)?;
                if !(1..TILE_WIDTH).contains(&w) {
                    return None;
                }
                (n, w as u16)
            }
            None => (rest, TILE_WIDTH as u16),
        };
        let index = parse_index(number)?;
        match kind {
            "entries" => Some(TileKey::Entries(TileId { level: 0, index, width })),
            level => {
                let level = canonical_decimal(level)?;
                if level > 63 {
                    return None;
                }
                Some(TileKey::Hashes(TileId { level: level as u8, index, width }))
            }
        }
    }
}

const ARCHIVE: &str = "ephem/checkpoints/";

/// A parsed `tile/…` key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TileKey {
    Hashes(TileId),
    Entries(TileId),
}

/// `<N>[.p/<W>]`.
fn coordinate(t: TileId) -> String {
    let mut s = encode_index(t.index);
    if t.is_partial() {
        s.push_str(&format!(".p/{}", t.width));
    }
    s
}

/// 1234067 → `x001/x234/067`.
pub fn encode_index(mut n: u64) -> String {
    let mut groups = vec![format!("{:03}", n % 1000)];
    n /= 1000;
    while n > 0 {
        groups.push(format!("x{:03}", n % 1000));
        n /= 1000;
    }
    groups.reverse();
    groups.join("/")
}

/// The inverse of [`encode_index`]; refuses every other spelling.
pub fn parse_index(s: &str) -> Option<u64> {
    let groups: Vec<&str> = s.split('/').collect();
    let (last, first) = groups.split_last()?;
    let mut n: u64 = 0;
    for (i, g) in first.iter().enumerate() {
        let digits = g.strip_prefix('x')?;
        // No leading all-zero group: the encoding is unique.
        if i == 0 && digits == "000" {
            return None;
        }
        n = n.checked_mul(1000)?.checked_add(three_digits(digits)?)?;
    }
    n.checked_mul(1000)?.checked_add(three_digits(last)?)
}

fn three_digits(g: &str) -> Option<u64> {
    (g.len() == 3 && g.bytes().all(|b| b.is_ascii_digit())).then(|| g.parse().ok())?
}

fn canonical_decimal(s: &str) -> Option<u64> {
    let ok = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if ok { s.parse().ok() } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_encoding_is_the_specs() {
        assert_eq!(encode_index(0), "000");
        assert_eq!(encode_index(67), "067");
        assert_eq!(encode_index(1000), "x001/000");
        assert_eq!(encode_index(1234067), "x001/x234/067");
        for n in [0, 1, 999, 1000, 1234067, u64::MAX] {
            assert_eq!(parse_index(&encode_index(n)), Some(n));
        }
        for bad in ["", "67", "0067", "x000/067", "001/067", "x1/067", "x001/x234/67"] {
            assert_eq!(parse_index(bad), None, "{bad}");
        }
    }

    #[test]
    fn paths_and_their_parsing() {
        let l = Layout::new("ledger");
        let full = TileId { level: 1, index: 1234067, width: 256 };
        let partial = TileId { level: 0, index: 3, width: 112 };
        assert_eq!(l.tile(full), "ledger/tile/1/x001/x234/067");
        assert_eq!(l.tile(partial), "ledger/tile/0/003.p/112");
        assert_eq!(l.entries(partial), "ledger/tile/entries/003.p/112");
        assert_eq!(l.checkpoint(), "ledger/checkpoint");
        assert_eq!(l.parse_tile_key(&l.tile(full)), Some(TileKey::Hashes(full)));
        assert_eq!(l.parse_tile_key(&l.entries(partial)), Some(TileKey::Entries(partial)));
        for bad in ["ledger/tile/0/003.p/0", "ledger/tile/0/003.p/256", "ledger/tile/64/000", "ledger/tile/01/000", "tile/0/000"] {
            assert_eq!(l.parse_tile_key(bad), None, "{bad}");
        }
        assert_eq!(l.archived_size(&l.archived_checkpoint(70_000)), Some(70_000));
        assert_eq!(Layout::new("").checkpoint(), "checkpoint");
    }

    /// The example of the spec: a tree of 70,000 entries.
    #[test]
    fn tiles_of_a_tree_of_70000() {
        let tiles = tiles_of(70_000, 0);
        let level = |l: u8| tiles.iter().filter(|t| t.level == l).collect::<Vec<_>>();
        assert_eq!(level(0).len(), 274);
        assert_eq!(level(0).iter().filter(|t| !t.is_partial()).count(), 273);
        assert_eq!(level(0).last().unwrap().width, 112);
        assert_eq!(level(1).iter().map(|t| t.width).collect::<Vec<_>>(), vec![256, 17]);
        assert_eq!(level(2).iter().map(|t| t.width).collect::<Vec<_>>(), vec![1]);
        assert!(level(3).is_empty());
        // A tree of 256: one full level-0 tile and a level-1 tile of width 1.
        assert_eq!(
            tiles_of(256, 0),
            vec![TileId { level: 0, index: 0, width: 256 }, TileId { level: 1, index: 0, width: 1 }]
        );
    }

    #[test]
    fn a_commit_changes_only_the_right_edge() {
        assert_eq!(tiles_of(5, 5), vec![]);
        assert_eq!(tiles_of(7, 5), vec![TileId { level: 0, index: 0, width: 7 }]);
        let changed = tiles_of(600, 250);
        assert_eq!(
            changed,
            vec![
                TileId { level: 0, index: 0, width: 256 },
                TileId { level: 0, index: 1, width: 256 },
                TileId { level: 0, index: 2, width: 88 },
                TileId { level: 1, index: 0, width: 2 },
            ]
        );
        assert_eq!(bundles_of(600, 250).len(), 3);
    }
}
