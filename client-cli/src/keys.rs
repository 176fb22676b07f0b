//! The client's result key (HPKE X25519): results are sealed to it, so only its holder opens
//! them. `ephem-batch keygen` makes one; `submit` makes one on first use.

use std::path::Path;

use anyhow::anyhow;
use protocol::envelope::ResultSecretKey;

use crate::home::{create_private, read_private, write_private};

/// Loads the key, or creates it when `create` and the file does not exist. The file must be a
/// regular file of this user's, mode 0600, not reached through a link ([`read_private`]).
pub fn load_result_key(path: &Path, create: bool) -> anyhow::Result<ResultSecretKey> {
    match read_private(path) {
        Ok(bytes) => {
            let text = std::str::from_utf8(&bytes).map_err(|_| anyhow!("{}: not a hex result key", path.display()))?;
            let bytes = zeroize::Zeroizing::new(hex::decode(text.trim()).map_err(|_| anyhow!("{}: not a hex result key", path.display()))?);
            ResultSecretKey::from_bytes(&bytes).map_err(|e| anyhow!("{}: {e}", path.display()))
        }
        Err(error) if error.is_not_found() && create => {
            // Create-only: two first submissions at once must end with one key, the one both
            // seal to, not each its own with the loser's overwritten (its results lost).
            let key = ResultSecretKey::generate();
            if !create_private(path, hex::encode(key.to_bytes().as_slice()).as_bytes())? {
                return load_result_key(path, false);
            }
            eprintln!("created result key {} (key id {})", path.display(), hex::encode(key.public_key().key_id()));
            Ok(key)
        }
        Err(error) => Err(error.into()),
    }
}

/// `ephem-batch keygen`: create-only unless `force` (results sealed to a replaced key are
/// lost). Checking for the file and then writing it would race a first `submit` creating it:
/// the submission would seal to a key keygen then replaced.
pub fn keygen(path: &Path, force: bool) -> anyhow::Result<ResultSecretKey> {
    let key = ResultSecretKey::generate();
    let encoded = zeroize::Zeroizing::new(hex::encode(key.to_bytes().as_slice()));
    if force {
        write_private(path, encoded.as_bytes())?;
    } else if !create_private(path, encoded.as_bytes())? {
        return Err(anyhow!("{} exists; results sealed to it open only with it (use --force to replace it)", path.display()));
    }
    Ok(key)
}

/// An Ed25519 signing key stored as its seed, 64 hex digits (`ephem-batch policy keygen`),
/// held to the same checks as the result key.
pub fn read_signing_key(path: &Path) -> anyhow::Result<ed25519_dalek::SigningKey> {
    let bytes = read_private(path)?;
    let seed: [u8; 32] = std::str::from_utf8(&bytes)
        .ok()
        .and_then(|text| hex::decode(text.trim()).ok())
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| anyhow!("{}: expected an Ed25519 seed as 64 hex digits", path.display()))?;
    Ok(ed25519_dalek::SigningKey::from_bytes(&seed))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

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

    /// A key file this user can trust: a regular file, its own, mode 0600.
    fn planted(dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        load_result_key(&path, true).unwrap();
        path
    }

    fn refusal(path: &Path) -> String {
        format!("{:#}", load_result_key(path, false).err().expect("refused"))
    }

    #[test]
    fn a_key_reached_through_a_link_is_refused_naming_the_link() {
        // Another local user (or a tool) replaces result.key with a link to a file it chose.
        let dir = tempfile::tempdir().unwrap();
        let target = planted(dir.path(), "elsewhere.key");
        let path = dir.path().join("result.key");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let error = refusal(&path);
        assert!(error.contains(&path.display().to_string()) && error.contains("symbolic link"), "{error}");
    }

    #[test]
    fn a_key_that_is_not_a_regular_file_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("result.key");
        std::fs::create_dir(&path).unwrap();
        let error = refusal(&path);
        assert!(error.contains("not a regular file") && error.contains("directory"), "{error}");
        std::fs::remove_dir(&path).unwrap();
        // A FIFO opened for reading would block until someone writes the key they choose.
        assert!(std::process::Command::new("mkfifo").arg(&path).status().unwrap().success());
        let (sent, received) = std::sync::mpsc::channel();
        let fifo = path.clone();
        std::thread::spawn(move || sent.send(refusal(&fifo)).unwrap());
        let error = received.recv_timeout(std::time::Duration::from_secs(5)).expect("refused at once, not blocked on the FIFO");
        assert!(error.contains("not a regular file") && error.contains("FIFO"), "{error}");
    }

    #[test]
    fn a_key_owned_by_another_user_is_refused_naming_the_owner() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = planted(dir.path(), "result.key");
        let meta = std::fs::metadata(&path).unwrap();
        // The check itself, for a user who is not the file's owner (runs unprivileged too).
        let error = crate::home::check_private_metadata(&path, &meta, meta.uid() + 1).expect_err("refused").to_string();
        assert!(error.contains(&format!("owned by uid {}", meta.uid())), "{error}");
        // And for real where this process may give the file away (root in CI containers).
        if std::os::unix::fs::chown(&path, Some(4242), None).is_ok() {
            let error = refusal(&path);
            assert!(error.contains("owned by uid 4242"), "{error}");
        }
    }

    #[test]
    fn a_jobs_commitment_key_is_held_to_the_same_checks() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let home = crate::home::Home::resolve(Some(dir.path())).unwrap();
        let files = crate::jobstate::JobFiles::new(&home, &"ab".repeat(16));
        files.save_commitment_key(&[7; 32]).unwrap();
        assert_eq!(*files.commitment_key().unwrap(), [7; 32]);
        let path = home.job_dir(&"ab".repeat(16)).join("commitment.key");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = format!("{:#}", files.commitment_key().expect_err("refused"));
        assert!(error.contains("mode 644") && error.contains("commitment.key"), "{error}");
    }

    #[test]
    fn keygen_racing_a_first_submission_never_leaves_two_keys() {
        // `keygen` and the first `submit` at once: whatever the interleaving, the key on disk
        // is the one the submission sealed to, and keygen either made that very key or refused.
        for round in 0..40 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("client").join("result.key");
            let barrier = std::sync::Barrier::new(2);
            let (made, sealed_to) = std::thread::scope(|scope| {
                let keygen = scope.spawn(|| {
                    barrier.wait();
                    keygen(&path, false).map(|k| k.to_bytes().to_vec())
                });
                let submit = scope.spawn(|| {
                    barrier.wait();
                    load_result_key(&path, true).unwrap().to_bytes().to_vec()
                });
                (keygen.join().unwrap(), submit.join().unwrap())
            });
            let on_disk = load_result_key(&path, false).unwrap().to_bytes().to_vec();
            assert_eq!(on_disk, sealed_to, "round {round}: the key the submission sealed to was replaced");
            match made {
                Ok(key) => assert_eq!(key, on_disk, "round {round}: keygen reported a key that is not on disk"),
                Err(error) => assert!(error.to_string().contains("exists"), "round {round}: {error}"),
            }
            let left: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
            assert_eq!(left, ["result.key"], "round {round}: no temporary file left");
        }
    }
}
