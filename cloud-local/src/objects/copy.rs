//! [`DirObjectStore`]'s copy: the source file the store opens is one version (every write is a
//! new inode), so its etag is checked on the open file and the bytes copied are that version's,
//! whatever is written to the key meanwhile. The copy goes to a temporary file (the kernel's
//! `copy_file_range` where it can) and is placed like any write: the destination's condition
//! under the store lock, then the created hooks.

use std::io;

use super::{object_meta, DirObjectStore};
use cloud::objects::{same_etag, ObjectError, ObjectMeta, PutCondition};

impl DirObjectStore {
    pub(super) fn copy_file(
        &self,
        from: &str,
        to: &str,
        source_etag: Option<&str>,
        condition: PutCondition,
    ) -> Result<ObjectMeta, ObjectError> {
        super::validate_key(to)?;
        let (mut source, _) = self.inner.open_object(from)?;
        let version = object_meta(from.to_owned(), &source.metadata().map_err(|e| ObjectError::io(from, e))?);
        if source_etag.is_some_and(|etag| !same_etag(etag, &version.etag)) {
            return Err(ObjectError::PreconditionFailed { key: from.to_owned() });
        }
        self.inner.precheck(to, &condition)?;
        let (temp, mut file) = self.inner.new_temp(to)?;
        io::copy(&mut source, &mut file).and_then(|_| file.sync_all()).map_err(|e| ObjectError::io(to, e))?;
        drop(file);
        self.inner.commit(to, temp, &condition)
    }
}

#[cfg(test)]
mod tests {
    use crate::DirObjectStore;
    use cloud::objects::{ObjectError, ObjectStore, PutCondition};

    #[test]
    fn a_copy_is_of_the_version_named_and_fires_the_created_hook() {
        let dir = tempfile::tempdir().unwrap();
        let s = DirObjectStore::open(dir.path()).unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let hook_seen = seen.clone();
        s.set_created_hook("jobs/", "", std::sync::Arc::new(move |m: &cloud::ObjectMeta| {
            hook_seen.lock().unwrap().push(m.key.clone());
            Ok(())
        }));
        let first = s.put("in/a", b"first", PutCondition::CreateOnly).unwrap();
        let copied = s.copy("in/a", "jobs/a", Some(&first.etag), PutCondition::CreateOnly).unwrap();
        assert_eq!((copied.size, s.get("jobs/a").unwrap()), (5, b"first".to_vec()));
        assert_eq!(*seen.lock().unwrap(), ["jobs/a"]);

        s.put("in/a", b"swapped", PutCondition::Overwrite).unwrap();
        let stale = s.copy("in/a", "jobs/b", Some(&first.etag), PutCondition::CreateOnly);
        assert!(matches!(&stale, Err(ObjectError::PreconditionFailed { key }) if key == "in/a"), "{stale:?}");
        assert_eq!(s.head("jobs/b").unwrap(), None);
        let taken = s.copy("in/a", "jobs/a", None, PutCondition::CreateOnly);
        assert!(matches!(taken, Err(ObjectError::AlreadyExists { .. })), "{taken:?}");
        assert!(matches!(s.copy("in/none", "jobs/c", None, PutCondition::CreateOnly), Err(ObjectError::NotFound { .. })));
    }
}
