//! The object-store port's provided methods (`get_at_most`, `list_page`), on the local adapter.

use cloud::objects::*;
use std::io::Read;
use cloud_local::DirObjectStore;

#[test]
fn get_at_most_reads_up_to_the_limit_and_refuses_more() {
    let dir = tempfile::tempdir().unwrap();
    let store = DirObjectStore::open(dir.path()).unwrap();
    store.put("small", &[7; 16], PutCondition::CreateOnly).unwrap();
    store.put("empty", b"", PutCondition::CreateOnly).unwrap();
    assert_eq!(store.get_at_most("small", 16).unwrap(), [7; 16]);
    assert_eq!(store.get_at_most("empty", 16).unwrap(), b"");
    match store.get_at_most("small", 15) {
        Err(ObjectError::Rejected { key, message }) => {
            assert_eq!(key, "small");
            assert!(message.contains("15 bytes"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(store.get_at_most("missing", 16), Err(ObjectError::NotFound { .. })));
    assert_eq!(store.get_at_most("small", u64::MAX).unwrap().len(), 16, "the limit saturates");
}

/// Only the required methods: `list_page` is the trait's default.
struct ListOnly(DirObjectStore);

impl ObjectStore for ListOnly {
    fn put(&self, key: &str, bytes: &[u8], condition: PutCondition) -> Result<ObjectMeta, ObjectError> {
        self.0.put(key, bytes, condition)
    }
    fn writer(&self, key: &str, condition: PutCondition) -> Result<Box<dyn ObjectWriter>, ObjectError> {
        self.0.writer(key, condition)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>, ObjectError> {
        self.0.get(key)
    }
    fn reader(&self, key: &str) -> Result<Box<dyn Read + Send>, ObjectError> {
        self.0.reader(key)
    }
    fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>, ObjectError> {
        self.0.read_range(key, offset, len)
    }
    fn head(&self, key: &str) -> Result<Option<ObjectMeta>, ObjectError> {
        self.0.head(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, ObjectError> {
        self.0.list(prefix)
    }
    fn delete(&self, key: &str) -> Result<(), ObjectError> {
        self.0.delete(key)
    }
}

#[test]
fn list_page_continues_after_a_key_and_stops_at_max_keys() {
    let dir = tempfile::tempdir().unwrap();
    let local = DirObjectStore::open(dir.path().join("objects")).unwrap();
    for key in ["r/a", "r/b/1", "r/b/2", "r/c", "rx", "s/a"] {
        local.put(key, b"x", PutCondition::CreateOnly).unwrap();
    }
    let default = ListOnly(local.clone());
    for store in [&local as &dyn ObjectStore, &default] {
        let keys = |after: Option<&str>, max: usize| -> Vec<String> {
            store.list_page("r/", after, max).unwrap().into_iter().map(|m| m.key).collect()
        };
        assert_eq!(keys(None, 2), ["r/a", "r/b/1"]);
        assert_eq!(keys(Some("r/b/1"), 2), ["r/b/2", "r/c"]);
        assert_eq!(keys(Some("r/b"), 10), ["r/b/1", "r/b/2", "r/c"], "a point between keys");
        assert_eq!(keys(Some("r/c"), 10), Vec::<String>::new());
        assert_eq!(keys(Some("a"), 1), ["r/a"], "a point before the prefix");
        assert_eq!(keys(None, 0), Vec::<String>::new());
    }
}
