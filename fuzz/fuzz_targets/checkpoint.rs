//! Ledger checkpoints and C2SP signed notes: arbitrary bytes as a signed checkpoint opened with a
//! pinned ledger key (the seeds are signed with it, plus the fixtures' signed notes), as a note,
//! as a checkpoint body and as a verifier key string. Checks: each accepted text has exactly one
//! form (re-serialising gives the same bytes), an opened checkpoint is the parse of the note's
//! text, and a parsed checkpoint signed with the ledger key opens to itself.
#![no_main]

use ephem_fuzz::fixed;
use libfuzzer_sys::fuzz_target;
use receipts_ledger::checkpoint::{Checkpoint, CheckpointError};
use receipts_ledger::note::{Note, NoteError, VerifierKey};

/// A note's bytes from its parts: text, a blank line, one `— name base64(id ‖ sig)` per line.
fn serialise(note: &Note) -> Vec<u8> {
    use base64::Engine;
    let mut out = note.text.clone();
    out.push('\n');
    for s in &note.signatures {
        let mut raw = s.id.to_be_bytes().to_vec();
        raw.extend_from_slice(&s.signature);
        out.push_str(&format!("\u{2014} {} {}\n", s.name, base64::engine::general_purpose::STANDARD.encode(raw)));
    }
    out.into_bytes()
}

fuzz_target!(|data: &[u8]| {
    let key = fixed::ledger_verifier();
    let note = Note::parse(data);
    if let Ok(note) = &note {
        assert_eq!(serialise(note), data, "the note has a second form");
    }
    match Checkpoint::open(data, key) {
        Ok(cp) => {
            let note = note.as_ref().expect("opened, so it parses");
            assert_eq!(Checkpoint::parse(&note.text).as_ref(), Ok(&cp));
            assert_eq!(cp.to_text(), note.text);
            assert_eq!(cp.origin, key.name());
        }
        Err(CheckpointError::Note(NoteError::BadSignature { .. } | NoteError::NoKnownSignature)) => {
            assert!(note.is_ok());
        }
        Err(_) => {}
    }
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(cp) = Checkpoint::parse(text) {
        assert_eq!(cp.to_text(), text, "the checkpoint body has a second form");
        let mut ours = cp.clone();
        ours.origin = fixed::LEDGER_ORIGIN.to_owned();
        // Signing refuses texts a note cannot carry (control characters, oversize).
        if let Ok(signed) = ours.sign(fixed::ledger_signer()) {
            assert_eq!(Checkpoint::open(signed.as_bytes(), key), Ok(ours));
        }
    }
    if let Ok(parsed) = VerifierKey::parse(text) {
        assert_eq!(parsed.to_string(), text, "the verifier key has a second form");
    }
});
