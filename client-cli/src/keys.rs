//! The client's result key (HPKE X25519): results are sealed to it, so only its holder opens
//! them. `ephem-batch keygen` makes one; `submit` makes one on first use.

use std::path::Path;

use anyhow::{anyhow, Context};
use protocol::envelope::ResultSecretKey;

use crate::home::{create_private, write_private};

/// Loads the key, or creates it when `create` and the file does not exist.
pub fn load_result_key(path: &Path, create: bool) -> anyhow::Result<ResultSecretKey> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            check_private(path)?;
            let bytes = hex::decode(text.trim()).map_err(|_| anyhow!("{}: not a hex result key", path.display()))?;
            ResultSecretKey::from_bytes(&bytes).map_err(|e| anyhow!("{}: {e}", path.display()))
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound && create => {
            // Create-only: two first submissions at once must end with one key, the one both
            // seal to, not each its own with the loser's overwritten (its results lost).
            let key = ResultSecretKey::generate();
            if !create_private(path, hex::encode(key.to_bytes().as_slice()).as_bytes())? {
                return load_result_key(path, false);
            }
            eprintln!("created result key {} (key id {})", path.display(), hex::encode(key.public_key().key_id()));
            Ok(key)
        }
        Err(error) => Err(error).with_context(|| format!("reading result key {}", path.display())),
    }
}

/// A key file anyone else may write (or read) is not the user's key: another account could
/// have swapped it for one it holds, and every result would be sealed to that account.
fn check_private(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).with_context(|| format!("reading result key {}", path.display()))?;
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(anyhow!(
            "result key {} has mode {mode:o}: others may read or replace it (chmod 600 it, or make a new one with `ephem-batch keygen`)",
            path.display()
        ));
    }
    Ok(())
}

/// `ephem-batch keygen`: refuses to overwrite an existing key (its results would be lost).
pub fn keygen(path: &Path, force: bool) -> anyhow::Result<ResultSecretKey> {
    if path.exists() && !force {
        return Err(anyhow!("{} exists; results sealed to it open only with it (use --force to replace it)", path.display()));
    }
    let key = ResultSecretKey::generate();
    write_private(path, hex::encode(key.to_bytes().as_slice()).as_bytes())?;
    Ok(key)
}

/// An Ed25519 signing key stored as its seed, 64 hex digits (`ephem-batch policy keygen`).
pub fn read_signing_key(path: &Path) -> anyhow::Result<ed25519_dalek::SigningKey> {
    let text = zeroize::Zeroizing::new(std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?);
    let seed: [u8; 32] = hex::decode(text.trim())
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| anyhow!("{}: expected an Ed25519 seed as 64 hex digits", path.display()))?;
    Ok(ed25519_dalek::SigningKey::from_bytes(&seed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_first_uses_end_with_one_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("client").join("result.key");
        let keys: Vec<Vec<u8>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8).map(|_| scope.spawn(|| load_result_key(&path, true).unwrap().to_bytes().to_vec())).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(keys.iter().all(|k| *k == keys[0]), "every submission seals to the same key");
        assert_eq!(load_result_key(&path, false).unwrap().to_bytes().to_vec(), keys[0]);
        let left: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["result.key"], "no temporary file left");
    }

    #[test]
    fn a_key_file_others_may_read_or_replace_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("result.key");
        let key = load_result_key(&path, true).unwrap();
        for mode in [0o644, 0o620, 0o606] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let error = load_result_key(&path, false).err().expect("refused");
            assert!(error.to_string().contains(&format!("mode {mode:o}")), "{error}");
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(load_result_key(&path, false).unwrap().to_bytes().to_vec(), key.to_bytes().to_vec());
    }
}
