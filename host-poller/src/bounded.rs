//! Whole-object reads of what another principal may write (a tenant, another host): never more
//! than a limit, whatever the listing said or a later overwrite made of the object. One such
//! object of a few GB, read whole, would take every poller that meets it down, over and over.

use cloud::{ObjectError, ObjectStore};

/// The most the host reads whole of a small object (receipt, status, manifest, fleet-key
/// record, attestation document): each of them passes through one frame (1 MiB) or is far
/// smaller, so 4 MiB refuses only what no component wrote.
pub(crate) const MAX_SMALL_OBJECT: u64 = 4 << 20;

/// `key` whole if it holds at most `limit` bytes: one ranged read of `limit + 1` bytes, and a
/// larger object is [`ObjectError::Rejected`] (not retried), naming the key and the limit.
pub(crate) fn get_at_most(store: &dyn ObjectStore, key: &str, limit: u64) -> Result<Vec<u8>, ObjectError> {
    let bytes = store.read_range(key, 0, limit.saturating_add(1))?;
    if bytes.len() as u64 > limit {
        return Err(ObjectError::Rejected { key: key.to_owned(), message: format!("larger than {limit} bytes, the most a host reads of it") });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use cloud::local::DirObjectStore;
    use cloud::PutCondition;

    use super::*;

    #[test]
    fn reads_up_to_the_limit_and_refuses_more() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirObjectStore::open(dir.path()).unwrap();
        store.put("small", &[7; 16], PutCondition::CreateOnly).unwrap();
        store.put("empty", b"", PutCondition::CreateOnly).unwrap();
        assert_eq!(get_at_most(&store, "small", 16).unwrap(), [7; 16]);
        assert_eq!(get_at_most(&store, "empty", 16).unwrap(), b"");
        match get_at_most(&store, "small", 15) {
            Err(ObjectError::Rejected { key, message }) => {
                assert_eq!(key, "small");
                assert!(message.contains("15 bytes"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(get_at_most(&store, "missing", 16), Err(ObjectError::NotFound { .. })));
        assert_eq!(get_at_most(&store, "small", u64::MAX).unwrap().len(), 16, "the limit saturates");
    }
}
