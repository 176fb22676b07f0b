//! The real NSM (cargo feature `nitro`), through `aws-nitro-enclaves-nsm-api`'s driver: the
//! `/dev/nsm` device, one `ioctl` per request. The driver functions are safe Rust functions (the
//! `unsafe` `ioctl` lives inside that crate), so this crate keeps `#![forbid(unsafe_code)]`.
//!
//! - `Attestation { public_key, user_data, nonce }` → the document bytes (COSE_Sign1, chained to
//!   the AWS Nitro Enclaves root G1);
//! - `DescribePCR { index }` for PCR0..=15, read once at [`NitroNsm::open`] (PCR0..4 and 8 are
//!   fixed at launch; the worker never extends a PCR, so they stay what documents carry).
//!
//! Clock: `now_ms` is the enclave's system clock. Key release additionally checks a fleet key's
//! `not_after` against the timestamp of the NSM-signed document made for that very release (see
//! `key_release::release_fleet_key`), which is the NSM's own clock.

use std::collections::BTreeMap;

use aws_nitro_enclaves_nsm_api::api::{Request, Response};
use aws_nitro_enclaves_nsm_api::driver::{nsm_exit, nsm_init, nsm_process_request};
use protocol::attestation::TrustAnchor;
use serde_bytes::ByteBuf;

use super::{AttestationRequest, Nsm, NsmError, system_now_ms};

/// PCRs read at open (the NSM exposes 32; 16..=31 are unused by Nitro Enclaves).
const PCRS_READ: u16 = 16;

/// The Nitro Secure Module of the enclave this worker runs in.
#[derive(Debug)]
pub struct NitroNsm {
    fd: i32,
    pcrs: BTreeMap<u8, Vec<u8>>,
}

impl NitroNsm {
    /// Opens `/dev/nsm` and reads PCR0..=15.
    pub fn open() -> Result<NitroNsm, NsmError> {
        let fd = nsm_init();
        if fd < 0 {
            return Err(NsmError::Unavailable("/dev/nsm could not be opened (not inside a Nitro enclave?)".into()));
        }
        // From here on `Drop` closes the descriptor.
        let mut nsm = NitroNsm { fd, pcrs: BTreeMap::new() };
        for index in 0..PCRS_READ {
            match nsm_process_request(fd, Request::DescribePCR { index }) {
                Response::DescribePCR { data, .. } => {
                    let key = u8::try_from(index).map_err(|_| NsmError::Response("PCR index".into()))?;
                    nsm.pcrs.insert(key, data);
                }
                Response::Error(code) => {
                    return Err(NsmError::Request(format!("DescribePCR {index}: {code:?}")));
                }
                _ => return Err(NsmError::Response(format!("DescribePCR {index}: unexpected response"))),
            }
        }
        Ok(nsm)
    }
}

impl Drop for NitroNsm {
    fn drop(&mut self) {
        nsm_exit(self.fd);
    }
}

impl Nsm for NitroNsm {
    fn attest(&self, request: AttestationRequest) -> Result<Vec<u8>, NsmError> {
        let AttestationRequest { public_key, user_data, nonce } = request;
        let request = Request::Attestation {
            user_data: user_data.map(ByteBuf::from),
            nonce: nonce.map(ByteBuf::from),
            public_key: public_key.map(ByteBuf::from),
        };
        match nsm_process_request(self.fd, request) {
            Response::Attestation { document } => Ok(document),
            Response::Error(code) => Err(NsmError::Request(format!("Attestation: {code:?}"))),
            _ => Err(NsmError::Response("Attestation: unexpected response".into())),
        }
    }

    fn pcrs(&self) -> &BTreeMap<u8, Vec<u8>> {
        &self.pcrs
    }

    fn now_ms(&self) -> u64 {
        system_now_ms()
    }

    fn trust_anchor(&self) -> TrustAnchor {
        TrustAnchor::aws_nitro_g1()
    }

    fn is_development(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_outside_an_enclave_is_a_named_error() {
        // These machines have no /dev/nsm (STACK.md §1: nsm_init() = -1).
        if std::path::Path::new("/dev/nsm").exists() {
            return;
        }
        let err = NitroNsm::open().unwrap_err();
        assert_eq!(err.check(), "nsm_unavailable");
    }
}
