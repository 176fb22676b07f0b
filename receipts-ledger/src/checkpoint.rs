//! C2SP tlog-checkpoint bodies (c2sp.org/tlog-checkpoint) and their signing
//! as signed notes.
//!
//! ```text
//! <origin>\n<decimal tree size>\n<base64 root hash>\n[<extension line>\n]*
//! ```

use crate::merkle::Hash;
use crate::note::{self, NoteError, NoteSigner, VerifierKey};
use base64::{engine::general_purpose::STANDARD, Engine};

/// Why a checkpoint body or a signed checkpoint was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    Note(#[from] NoteError),
    #[error("checkpoint text does not end with a newline")]
    NoFinalNewline,
    #[error("checkpoint has fewer than three lines")]
    TooFewLines,
    #[error("checkpoint origin line is empty")]
    EmptyOrigin,
    #[error("checkpoint tree size {0:?} is not a decimal u64 without leading zeros")]
    BadSize(String),
    #[error("checkpoint root hash is not canonical base64 of 32 bytes")]
    BadRoot,
    #[error("checkpoint extension line {0} is empty")]
    EmptyExtension(usize),
    #[error("checkpoint origin {origin:?} is not the key name {key:?}")]
    OriginMismatch { origin: String, key: String },
}

/// A log's tree head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub origin: String,
    pub size: u64,
    pub root: Hash,
    /// Opaque extension lines, without newlines (none are written by this ledger).
    pub extensions: Vec<String>,
}

impl Checkpoint {
    pub fn new(origin: &str, size: u64, root: Hash) -> Self {
        Self { origin: origin.to_owned(), size, root, extensions: Vec::new() }
    }

    /// The note text.
    pub fn to_text(&self) -> String {
        let mut s = format!("{}\n{}\n{}\n", self.origin, self.size, STANDARD.encode(self.root));
        for e in &self.extensions {
            s.push_str(e);
            s.push('\n');
        }
        s
    }

    /// Parses a note text (as returned by [`note::open`]).
    pub fn parse(text: &str) -> Result<Self, CheckpointError> {
        let body = text.strip_suffix('\n').ok_or(CheckpointError::NoFinalNewline)?;
        let mut lines = body.split('\n');
        let (Some(origin), Some(size), Some(root)) = (lines.next(), lines.next(), lines.next()) else {
            return Err(CheckpointError::TooFewLines);
        };
        if origin.is_empty() {
            return Err(CheckpointError::EmptyOrigin);
        }
        let size_ok = !size.is_empty()
            && size.bytes().all(|b| b.is_ascii_digit())
            && (size == "0" || !size.starts_with('0'));
        let size_n: u64 = if size_ok { size.parse().map_err(|_| CheckpointError::BadSize(size.to_owned()))? } else {
            return Err(CheckpointError::BadSize(size.to_owned()));
        };
        let root: Hash = STANDARD
            .decode(root)
            .ok()
            .and_then(|r| r.try_into().ok())
            .ok_or(CheckpointError::BadRoot)?;
        let mut extensions = Vec::new();
        for (i, line) in lines.enumerate() {
            if line.is_empty() {
                return Err(CheckpointError::EmptyExtension(i + 1));
            }
            extensions.push(line.to_owned());
        }
        Ok(Self { origin: origin.to_owned(), size: size_n, root, extensions })
    }

    /// The signed note of this checkpoint. The key name must be the origin.
    pub fn sign(&self, signer: &dyn NoteSigner) -> Result<String, CheckpointError> {
        if signer.key_name() != self.origin {
            return Err(CheckpointError::OriginMismatch {
                origin: self.origin.clone(),
                key: signer.key_name().to_owned(),
            });
        }
        Ok(note::sign(&self.to_text(), &[signer])?)
    }

    /// Verifies a signed checkpoint against one pinned key and parses it. The
    /// origin must equal the key's name.
    pub fn open(signed: &[u8], key: &VerifierKey) -> Result<Self, CheckpointError> {
        let text = note::open(signed, std::slice::from_ref(key))?;
        let cp = Self::parse(&text)?;
        if cp.origin != key.name() {
            return Err(CheckpointError::OriginMismatch { origin: cp.origin, key: key.name().to_owned() });
        }
        Ok(cp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::note::SignerKey;

    /// Known answer (cross-checked with Python `cryptography`), also in docs/protocol.md §8.
    pub(crate) const KAT_ORIGIN: &str = "ledger.ephem-batch.example/test";
    pub(crate) const KAT_SEED: [u8; 32] = [0x42; 32];

    #[test]
    fn known_answer_checkpoint() {
        let key = SignerKey::from_seed(KAT_ORIGIN, &KAT_SEED).unwrap();
        let root = crate::merkle::leaf_hash(b"");
        let cp = Checkpoint::new(KAT_ORIGIN, 1, root);
        let signed = cp.sign(&key).unwrap();
        assert_eq!(
            key.verifier().to_string(),
            "ledger.ephem-batch.example/test+70925f2d+ASFS+NGbeR0kRTJC4V8uq2y3z/p7al7TAJeWDgaYgdsS"
        );
        assert_eq!(
            signed,
            "ledger.ephem-batch.example/test\n1\nbjQLnP+zepicpUTmu3gKLHiQHT+zNzh2hRGjBhevoB0=\n\n\
             \u{2014} ledger.ephem-batch.example/test cJJfLQiVydxAguHsxpLq3XHBN8KvlcoizxHEjLBCo5vQHw3CqRvGG/x1EfRXcubJk07udDRggTi26ihBD0EfhM5Bbwg=\n"
        );
        assert_eq!(Checkpoint::open(signed.as_bytes(), &key.verifier()).unwrap(), cp);
    }

    #[test]
    fn spec_example_body_parses() {
        let cp = Checkpoint::parse(
            "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",
        )
        .unwrap();
        assert_eq!(cp.origin, "example.com/behind-the-sofa");
        assert_eq!(cp.size, 20852163);
        assert_eq!(cp.to_text().lines().count(), 3);
    }

    #[test]
    fn bad_bodies_are_named() {
        let r = "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=";
        let cases = [
            (format!("o\n1\n{r}"), CheckpointError::NoFinalNewline),
            ("o\n1\n".to_owned(), CheckpointError::TooFewLines),
            (format!("\n1\n{r}\n"), CheckpointError::EmptyOrigin),
            (format!("o\n01\n{r}\n"), CheckpointError::BadSize("01".into())),
            (format!("o\n+1\n{r}\n"), CheckpointError::BadSize("+1".into())),
            (format!("o\n\n{r}\n"), CheckpointError::BadSize("".into())),
            (format!("o\n18446744073709551616\n{r}\n"), CheckpointError::BadSize("18446744073709551616".into())),
            ("o\n1\nAAAA\n".to_owned(), CheckpointError::BadRoot),
            (format!("o\n1\n{}\n", r.trim_end_matches('=')), CheckpointError::BadRoot),
            (format!("o\n1\n{r}\next\n\n"), CheckpointError::EmptyExtension(2)),
        ];
        for (text, want) in cases {
            assert_eq!(Checkpoint::parse(&text), Err(want), "{text:?}");
        }
        let ok = Checkpoint::parse(&format!("o\n0\n{r}\nx\ny z\n")).unwrap();
        assert_eq!((ok.size, ok.extensions.len()), (0, 2));
        assert_eq!(Checkpoint::parse(&ok.to_text()).unwrap(), ok);
    }

    #[test]
    fn origin_must_be_the_key_name() {
        let key = SignerKey::from_seed("a.example", &[1; 32]).unwrap();
        let cp = Checkpoint::new("b.example", 3, [0; 32]);
        assert!(matches!(cp.sign(&key), Err(CheckpointError::OriginMismatch { .. })));
        let other = SignerKey::from_seed("a.example", &[2; 32]).unwrap();
        let signed = Checkpoint::new("a.example", 3, [0; 32]).sign(&key).unwrap();
        assert_eq!(
            Checkpoint::open(signed.as_bytes(), &other.verifier()),
            Err(CheckpointError::Note(NoteError::NoKnownSignature))
        );
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use crate::bundle::{verify_bundle, ProofBundle};
    use crate::merkle::{verify_consistency, verify_inclusion};
    use crate::note::{Note, SignerKey};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = Note::parse(&bytes);
            let _ = ProofBundle::from_json(&bytes);
            let _ = crate::note::VerifierKey::parse(&String::from_utf8_lossy(&bytes));
            let _ = SignerKey::parse(&String::from_utf8_lossy(&bytes));
            if let Ok(s) = std::str::from_utf8(&bytes) {
                let _ = Checkpoint::parse(s);
            }
        }

        #[test]
        fn checkpoint_text_mutations_never_panic(
            size in any::<u64>(), root in any::<[u8; 32]>(), at in any::<usize>(), b in any::<u8>(),
        ) {
            let key = SignerKey::from_seed("o.example", &[1; 32]).unwrap();
            let signed = Checkpoint::new("o.example", size, root).sign(&key).unwrap();
            prop_assert_eq!(Checkpoint::open(signed.as_bytes(), &key.verifier()).unwrap().size, size);
            let mut m = signed.into_bytes();
            let i = at % m.len();
            m[i] = b;
            let _ = Checkpoint::open(&m, &key.verifier());
            if let Ok(s) = std::str::from_utf8(&m) {
                let _ = Checkpoint::parse(s);
            }
        }

        #[test]
        fn verifiers_never_panic(
            index in any::<u64>(), size in any::<u64>(), n in 0usize..70, seed in any::<u8>(),
        ) {
            let proof: Vec<[u8; 32]> = (0..n).map(|i| [seed.wrapping_add(i as u8); 32]).collect();
            let _ = verify_inclusion(index, size, &[seed; 32], &proof, &[0; 32]);
            let _ = verify_consistency(index, size, &[seed; 32], &[0; 32], &proof);
            let bundle = ProofBundle {
                version: 1,
                receipt: "00".into(),
                attestation_document: String::new(),
                leaf_index: index,
                tree_size: size,
                inclusion_path: proof.iter().map(hex::encode).collect(),
                checkpoint: String::new(),
                ledger_key: String::new(),
            };
            let key = SignerKey::from_seed("o.example", &[1; 32]).unwrap().verifier();
            prop_assert!(verify_bundle(&bundle, &key).is_err());
        }
    }
}
