//! `cloud::hooked`: only the hooked calls of a store change.

use cloud::hooked::*;
use cloud::*;
use std::sync::Arc;
use cloud_local::DirObjectStore;

#[test]
fn only_the_hooked_calls_change() {
    let dir = tempfile::tempdir().unwrap();
    let store = Hooked::new(Arc::new(DirObjectStore::open(dir.path()).unwrap()), ThrottledPuts::new("jobs/a/"));
    assert!(matches!(store.put("jobs/a/status.json", b"x", PutCondition::Overwrite), Err(ObjectError::Unavailable { .. })));
    store.put("jobs/b/status.json", b"y", PutCondition::Overwrite).unwrap();
    assert_eq!(store.get_at_most("jobs/b/status.json", 8).unwrap(), b"y");
    assert_eq!(store.list_page("jobs/", None, 10).unwrap().len(), 1);
    store.hooks.set(false);
    store.put("jobs/a/status.json", b"x", PutCondition::Overwrite).unwrap();
    store.copy("jobs/a/status.json", "jobs/c/status.json", None, PutCondition::CreateOnly).unwrap();
    assert_eq!(store.inner.get("jobs/c/status.json").unwrap(), b"x");
}
