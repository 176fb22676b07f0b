#![forbid(unsafe_code)]
//! The untrusted relay on each host (DESIGN.md §2, §5, §6): long-polls the job queue, streams
//! each sealed input from the object store into the enclave worker and its sealed output back
//! under the attempt's own key, commits the receipt create-only, tells the ledger, and proxies
//! the worker's KMS calls and object reads on the control channel.
//!
//! It trusts nothing and holds nothing secret: every byte it moves is sealed or public, every
//! check that matters happens in the enclave, and every step is idempotent by job id.
//!
//! ```no_run
//! # fn services() -> cloud::Services { unimplemented!() }
//! use host_poller::{Poller, PollerConfig, WorkerEndpoint, WorkerSource};
//! let endpoint = WorkerEndpoint::parse("unix:.ephem/run/worker.sock").unwrap();
//! let poller = Poller::new(services(), PollerConfig::new(WorkerSource::Connect(endpoint)));
//! poller.shutdown_handle().on_signals().unwrap();
//! poller.run().unwrap();
//! ```

mod control;
mod delivery;
mod handover;
mod heartbeat;
mod image_versions;
mod job;
mod models_status;
pub mod online_relay;
mod pidfile;
mod poller;
mod relay;
mod residency;
mod retry;
mod shared;
mod status;
mod supervisor;
pub mod usage;
pub mod worker_link;

pub use delivery::Disposition;
pub use models_status::{HeldModel, ModelsStatus, MODELS_STATUS_FILE};
pub use online_relay::{OnlineRelay, OnlineRelayError, OnlineSettings};
pub use poller::{default_host_id, valid_host_id, Poller, PollerConfig, PollerError, WorkerSource};
pub use shared::ShutdownHandle;
pub use supervisor::{SpawnConfig, SupervisorError};
pub use worker_link::{EndpointError, LinkError, WorkerEndpoint, WorkerLink};
