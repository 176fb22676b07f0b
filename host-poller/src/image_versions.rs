//! Which version of each model this host's worker should hold: the newest one for its own image.
//!
//! During an image update the newest version is sealed to the new image's model key
//! (`Manifest::images`); a host of the old image that loaded it would be refused by KMS and, worse,
//! drop the version the old image's jobs name. The worker's image is read from the attestation
//! documents it publishes; before the first one, the newest version is taken. Nothing here is
//! trusted: the worker checks what it loads, KMS releases only to the image, and clients pick
//! their version by the same field under the publisher's signature.

use std::collections::HashMap;

use cloud::{ObjectError, ObjectStore, MAX_SMALL_OBJECT};
use protocol::attestation::AttestationDocument;
use protocol::manifest::SignedManifest;

use crate::retry;

/// One listed version of a model: (version, manifest key, etag).
pub(crate) type Listed = (u64, String, String);

#[derive(Default)]
pub(crate) struct ImageVersions {
    /// PCR0 of the worker's image, from its newest published document.
    pcr0: Option<Vec<u8>>,
    /// Manifest key → (etag, the images it names), so a pass reads each manifest once.
    images: HashMap<String, (String, Vec<[u8; 48]>)>,
}

impl ImageVersions {
    /// Learns the worker's image from a document it published.
    pub fn learn(&mut self, document: &[u8]) {
        if let Some(pcr0) = AttestationDocument::parse_unverified(document).ok().and_then(|d| d.pcrs.get(&0).cloned()) {
            if self.pcr0.as_ref() != Some(&pcr0) {
                tracing::info!(pcr0 = %hex::encode(&pcr0), "the worker's image");
                self.pcr0 = Some(pcr0);
            }
        }
    }

    /// The newest of `versions` (ascending) that is for the worker's image; a manifest that
    /// cannot be read or decoded is for no image.
    pub fn choose<'a>(&mut self, models: &dyn ObjectStore, versions: &'a [Listed]) -> Result<Option<&'a Listed>, ObjectError> {
        let Some(pcr0) = self.pcr0.clone() else { return Ok(versions.last()) };
        for listed in versions.iter().rev() {
            let (_, key, etag) = listed;
            let images = match self.images.get(key).filter(|(seen, _)| seen == etag) {
                Some((_, images)) => images.clone(),
                None => {
                    let images = match retry::transient("get manifest", || models.get_at_most(key, MAX_SMALL_OBJECT)) {
                        Ok(bytes) => SignedManifest::decode(&bytes).map(|s| s.manifest.images).ok(),
                        Err(ObjectError::NotFound { .. }) => None,
                        Err(error) => return Err(error),
                    };
                    let Some(images) = images else { continue };
                    self.images.insert(key.clone(), (etag.clone(), images.clone()));
                    images
                }
            };
            if images.is_empty() || images.iter().any(|image| image.as_slice() == pcr0) {
                return Ok(Some(listed));
            }
        }
        Ok(None)
    }
}
