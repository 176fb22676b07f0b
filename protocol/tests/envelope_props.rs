//! Property tests: envelopes of random sizes round-trip when pushed in random pieces, and every
//! tampering — a flipped byte anywhere, a cut anywhere, swapped or foreign chunks — is refused.

use proptest::prelude::*;
use protocol::envelope::{
    open_job, seal_job, FleetSecretKey, JobHeader, JobId, JobOptions, Preamble, ResultSecretKey, StreamKind,
};
use protocol::stream::SEALED_CHUNK_SIZE;
use std::sync::OnceLock;

struct Keys {
    fleet: FleetSecretKey,
    client: ResultSecretKey,
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| Keys { fleet: FleetSecretKey::generate(), client: ResultSecretKey::generate() })
}

fn header(records: u64) -> JobHeader {
    let keys = keys();
    JobHeader {
        fleet_key_id: keys.fleet.public_key().key_id(),
        epoch: 1,
        model_id: "m".into(),
        manifest_hash: [0; 32],
        options: JobOptions::default(),
        result_public_key: keys.client.public_key().to_bytes(),
        record_count: records,
        created_ms: 0,
    }
}

/// Cheap deterministic filler, so multi-MiB plaintexts cost little to make.
fn plaintext(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn seal(plaintext: &[u8], piece: usize) -> (JobId, Vec<u8>) {
    let sealed = seal_job(&header(1), &keys().fleet.public_key()).unwrap();
    let id = JobId(sealed.stream_id);
    let mut out = sealed.preamble;
    let mut sealer = sealed.sealer;
    for part in plaintext.chunks(piece.max(1)) {
        sealer.push(part, &mut out).unwrap();
    }
    sealer.finish(&mut out).unwrap();
    (id, out)
}

fn open(bytes: &[u8], claimed: JobId, piece: usize) -> Result<Vec<u8>, String> {
    let (preamble, used) = Preamble::parse_complete(bytes, StreamKind::JobInput).map_err(|e| e.to_string())?;
    let mut opened = open_job(&preamble, &keys().fleet, Some(claimed)).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for part in bytes[used..].chunks(piece.max(1)) {
        opened.opener.push(part, &mut out).map_err(|e| e.to_string())?;
    }
    opened.opener.finish(&mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![0usize..200, 65_000usize..140_000, 1_000_000usize..4_500_000]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn round_trips(len in size(), seed in any::<u64>(), seal_piece in 1usize..300_000, open_piece in 1usize..300_000) {
        let data = plaintext(len, seed);
        let (id, sealed) = seal(&data, seal_piece);
        prop_assert_eq!(open(&sealed, id, open_piece).unwrap(), data);
    }

    #[test]
    fn any_flipped_byte_is_refused(len in size(), seed in any::<u64>(), at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let (id, mut sealed) = seal(&plaintext(len, seed), 70_000);
        let at = at.index(sealed.len());
        sealed[at] ^= 1 << bit;
        prop_assert!(open(&sealed, id, 100_000).is_err(), "flip at {} of {} accepted", at, sealed.len());
    }

    #[test]
    fn any_cut_is_refused(len in size(), seed in any::<u64>(), cut in any::<prop::sample::Index>()) {
        let (id, sealed) = seal(&plaintext(len, seed), 70_000);
        let cut = cut.index(sealed.len());
        prop_assert!(open(&sealed[..cut], id, 100_000).is_err());
    }

    #[test]
    fn swapped_chunks_are_refused_by_name(chunks in 3usize..8, seed in any::<u64>(), a in 0usize..8, b in 0usize..8) {
        let len = chunks * 65_536 - 100;
        let (id, sealed) = seal(&plaintext(len, seed), 65_536);
        let body = sealed.len() - (chunks - 1) * SEALED_CHUNK_SIZE - (65_536 - 100 + 32);
        let (a, b) = (a % (chunks - 1), b % (chunks - 1));
        prop_assume!(a != b);
        let mut swapped = sealed.clone();
        let range = |i: usize| body + i * SEALED_CHUNK_SIZE..body + (i + 1) * SEALED_CHUNK_SIZE;
        swapped[range(a)].copy_from_slice(&sealed[range(b)]);
        swapped[range(b)].copy_from_slice(&sealed[range(a)]);
        let error = open(&swapped, id, 100_000).unwrap_err();
        prop_assert!(error.contains("out of order"), "{}", error);
    }
}

#[test]
fn chunks_of_another_job_to_the_same_key_are_refused_by_name() {
    let data = plaintext(3 * 65_536, 5);
    let (id, mine) = seal(&data, 65_536);
    let (_, theirs) = seal(&data, 65_536);
    let preamble_len = mine.len() - 3 * SEALED_CHUNK_SIZE;
    let mut spliced = mine.clone();
    let chunk = preamble_len + SEALED_CHUNK_SIZE..preamble_len + 2 * SEALED_CHUNK_SIZE;
    spliced[chunk.clone()].copy_from_slice(&theirs[chunk]);
    let error = open(&spliced, id, 100_000).unwrap_err();
    assert!(error.contains("belongs to another stream"), "{error}");
}
