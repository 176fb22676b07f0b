//! The local backend opens only with the upload wiring the binary installs: without it nothing
//! would ever pick up a submitted job. Its own test binary, so nothing else installs one first.

use ephem_batch_client::backend::{self, BackendArgs};
use ephem_batch_client::home::Home;

#[test]
fn the_local_backend_refuses_to_open_without_upload_wiring_and_opens_with_it() {
    let tmp = tempfile::tempdir().unwrap();
    let home = Home::resolve(Some(tmp.path())).unwrap();
    let error = backend::open(&home, &BackendArgs::default()).map(drop).unwrap_err().to_string();
    assert!(error.contains("no upload wiring installed"), "{error}");

    static WIRED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    backend::install_local_wiring(|_, _| {
        WIRED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    let opened = backend::open(&home, &BackendArgs::default()).unwrap();
    assert!(opened.local.is_some());
    assert_eq!(WIRED.load(std::sync::atomic::Ordering::SeqCst), 1, "the installed wiring ran once");
}
