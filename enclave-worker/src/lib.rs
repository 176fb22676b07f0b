// No unsafe code, with two exceptions behind checked safe APIs: the dense layers' SIMD kernels
// (`inference::dense::kernel`) and gemm on strided views (`inference::strided`).
#![deny(unsafe_code)]
//! Everything that runs inside the Nitro enclave: NSM access, key release, model loading,
//! inference, sealing results, signing receipts.
//!
//! This crate is the trusted computing base. It has no network client of any kind: every byte
//! from outside arrives as a frame from the host, and is authenticated before it is used.

pub mod control;
#[cfg(feature = "dev")]
pub mod dev_model;
pub mod inference;
pub mod job;
pub mod key_release;
pub mod model_memory;
pub mod nsm;
pub mod one_shot_key;
pub mod online;
pub mod transport;
pub mod worker;

use std::io::Write;
use std::sync::Arc;

use ed25519_dalek::VerifyingKey;
use protocol::frame::{self, Channel, Message, Role};

pub use worker::Worker;

use crate::key_release::RsaKeyPool;
use crate::nsm::Nsm;
use crate::transport::Connection;

/// The model publisher key compiled into this image, if the build named one
/// (`EPHEM_MODEL_PUBLISHER_PUBKEY`, 64 hex digits).
const PUBLISHER_KEY_HEX: Option<&str> = option_env!("EPHEM_MODEL_PUBLISHER_PUBKEY");

#[cfg(not(any(feature = "nitro", feature = "dev")))]
compile_error!("enclave-worker needs an NSM: build with --features nitro (an enclave image) or --features dev (the embedded default)");

/// The NSM this build uses and the model publisher key it trusts. Without a compiled-in publisher
/// key, only the development NSM runs, with the well-known development publisher.
pub fn boot_nsm(state_dir: &std::path::Path) -> Result<(Arc<dyn Nsm>, VerifyingKey), String> {
    #[cfg(feature = "nitro")]
    {
        let _ = state_dir;
        let hex_key = PUBLISHER_KEY_HEX.ok_or("this image was built without EPHEM_MODEL_PUBLISHER_PUBKEY")?;
        let publisher = parse_publisher(hex_key)?;
        let nsm = nsm::NitroNsm::open().map_err(|e| format!("NSM: {e}"))?;
        Ok((Arc::new(nsm), publisher))
    }
    #[cfg(all(feature = "dev", not(feature = "nitro")))]
    {
        let publisher = match PUBLISHER_KEY_HEX {
            Some(hex_key) => parse_publisher(hex_key)?,
            None => protocol::manifest::development_publisher().verifying_key(),
        };
        let nsm = nsm::DevNsm::open(state_dir).map_err(|e| format!("development NSM: {e}"))?;
        Ok((Arc::new(nsm), publisher))
    }
    #[cfg(not(any(feature = "nitro", feature = "dev")))]
    {
        let _ = state_dir;
        Err("this build has no NSM".to_owned())
    }
}

fn parse_publisher(hex_key: &str) -> Result<VerifyingKey, String> {
    let bytes: [u8; 32] = hex::decode(hex_key)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or("EPHEM_MODEL_PUBLISHER_PUBKEY is not 64 hex digits")?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| "EPHEM_MODEL_PUBLISHER_PUBKEY is not an Ed25519 key".to_owned())
}

/// Answers the host's `Hello` and serves the connection as the channel it names.
pub fn serve_connection(worker: &Worker, online: &online::OnlineState, pool: &RsaKeyPool, mut connection: Box<dyn Connection>) {
    let channel = match frame::read_frame(&mut connection) {
        Ok(Some(Message::Hello { role: Role::Host, channel })) => channel,
        Ok(other) => {
            tracing::warn!(?other, "connection did not start with a host Hello");
            return;
        }
        Err(error) => {
            tracing::warn!(%error, "connection failed before Hello");
            return;
        }
    };
    let hello = Message::Hello { role: Role::Enclave, channel };
    if frame::write_frame(&mut connection, &hello).and_then(|()| connection.flush().map_err(Into::into)).is_err() {
        return;
    }
    match channel {
        Channel::Control => {
            if let Err(error) = control::serve(worker, online, pool, &mut connection) {
                tracing::warn!(%error, "control connection ended");
            }
        }
        Channel::Job => {
            let _ = job::serve(worker, &mut connection);
        }
        Channel::Online => {
            if let Err(error) = online::serve(worker, online, &mut connection) {
                tracing::debug!(%error, "online connection ended");
            }
        }
    }
}
