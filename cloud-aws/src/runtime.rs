//! The blocking bridge: the traits are blocking (the host-poller and the client move bytes with
//! threads), the SDK is async, so every adapter drives its calls on one private tokio runtime.

use std::future::Future;
use std::sync::Arc;

use tokio::runtime::{Handle, Runtime, RuntimeFlavor};

/// A shared tokio runtime that the adapters block on. Cheap to clone.
#[derive(Clone)]
pub struct AwsRuntime {
    inner: Arc<Owned>,
}

/// Shuts the runtime down without waiting, so dropping the last handle is allowed anywhere
/// (dropping a `Runtime` inside an async context panics).
struct Owned(Option<Runtime>);

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

impl std::fmt::Debug for AwsRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AwsRuntime")
    }
}

impl AwsRuntime {
    /// Two worker threads: the adapters' work is I/O, and a part upload may run beside a read.
    pub fn new() -> std::io::Result<AwsRuntime> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ephem-aws")
            .enable_all()
            .build()?;
        Ok(AwsRuntime { inner: Arc::new(Owned(Some(runtime))) })
    }

    fn runtime(&self) -> &Runtime {
        self.inner.0.as_ref().expect("the runtime lives until the last handle is dropped")
    }

    /// Runs `future` to completion from blocking code. Called from inside another multi-thread
    /// runtime (a Lambda binary), it first moves off that runtime's worker; from a
    /// current-thread runtime it cannot block, and says so.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        match Handle::try_current().map(|h| h.runtime_flavor()) {
            Err(_) => self.runtime().block_on(future),
            Ok(RuntimeFlavor::CurrentThread) => {
                panic!("the AWS adapters are blocking: call them from tokio::task::spawn_blocking, not a current-thread runtime")
            }
            Ok(_) => tokio::task::block_in_place(|| self.runtime().block_on(future)),
        }
    }

    /// Starts `future` in the background (part uploads that overlap the next part's buffering).
    pub fn spawn<F>(&self, future: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.runtime().spawn(future)
    }
}

impl AwsRuntime {
    /// Runs a clean-up to its end where blocking is allowed, else in the background (a drop
    /// inside async code must not block).
    pub(crate) fn finish<F>(&self, future: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if Handle::try_current().is_ok() {
            drop(self.spawn(future));
        } else {
            self.runtime().block_on(future);
        }
    }
}
