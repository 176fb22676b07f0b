//! One-shot RSA-2048 recipient keys and the pool that generates them ahead of time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use protocol::cms::CmsError;
use rsa::RsaPrivateKey;
use rsa::pkcs8::EncodePublicKey;
use zeroize::Zeroizing;

/// Why no one-shot key could be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KeyGenerationError(pub String);

/// RSA modulus size of a recipient key (KMS `RSAES_OAEP_SHA_256` with an RSA-2048 key).
pub const RSA_BITS: usize = 2048;

/// An RSA-2048 key generated inside the worker for exactly **one** KMS `Recipient` decryption
/// (DESIGN.md §3: a one-shot key leaves a hostile host no Bleichenbacher/Marvin-style oracle to
/// query, which is also the structural mitigation of RUSTSEC-2023-0071).
///
/// - It cannot be cloned, serialized or imported: the only way to get one is [`generate`]
///   (directly or through a [`RsaKeyPool`]).
/// - [`open`] takes `self`: after one envelope, successful or not, the key is gone. The private
///   key is zeroized on drop (`rsa::RsaPrivateKey` is `ZeroizeOnDrop`).
///
/// [`generate`]: OneShotKey::generate
/// [`open`]: OneShotKey::open
pub struct OneShotKey {
    private: RsaPrivateKey,
    spki_der: Vec<u8>,
}

impl core::fmt::Debug for OneShotKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let id = protocol::cms::subject_key_identifier(&self.spki_der);
        f.debug_struct("OneShotKey").field("spki_sha256", &hex::encode(id)).finish_non_exhaustive()
    }
}

impl OneShotKey {
    /// Generates a key from the OS RNG (slow and variable: tens to hundreds of ms; use a
    /// [`RsaKeyPool`] to generate ahead).
    pub fn generate() -> Result<OneShotKey, KeyGenerationError> {
        let mut rng = rsa::rand_core::UnwrapErr(getrandom::SysRng);
        let private =
            RsaPrivateKey::new(&mut rng, RSA_BITS).map_err(|e| KeyGenerationError(e.to_string()))?;
        let spki_der = private
            .to_public_key()
            .to_public_key_der()
            .map_err(|e| KeyGenerationError(format!("SPKI encoding: {e}")))?
            .as_bytes()
            .to_vec();
        Ok(OneShotKey { private, spki_der })
    }

    /// The public key as SubjectPublicKeyInfo DER: what goes into the attestation document's
    /// `public_key`.
    pub fn public_key_der(&self) -> &[u8] {
        &self.spki_der
    }

    /// Opens one `CiphertextForRecipient` (BER CMS EnvelopedData) and destroys the key.
    pub fn open(self, envelope: &[u8]) -> Result<Zeroizing<Vec<u8>>, CmsError> {
        protocol::cms::open(envelope, &self.private)
        // `self` drops here: the private key is zeroized whatever the outcome.
    }
}

/// Pre-generates [`OneShotKey`]s on background threads so that boot overlaps RSA key generation
/// with other work (model manifests, object reads). Keeps up to `ready` keys waiting; each key is
/// handed out once. Dropping the pool stops the threads (after the keys they are generating) and
/// zeroizes the keys still waiting. If no thread can be started or all have stopped, keys are
/// generated on the caller's thread instead.
pub struct RsaKeyPool {
    receiver: Option<Mutex<Receiver<Result<OneShotKey, String>>>>,
    ready: Arc<AtomicUsize>,
}

impl core::fmt::Debug for RsaKeyPool {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RsaKeyPool").field("ready", &self.ready()).field("background", &self.receiver.is_some()).finish()
    }
}

impl RsaKeyPool {
    /// Starts `generators` threads (at least 1, at most `ready`), which keep `ready` keys (at
    /// least 1) waiting. A boot asks for two keys within a few hundred ms (the fleet key's
    /// release, then the model's); a prime search's time varies several-fold, so two generators
    /// have both ready after the slower of two searches instead of after their sum. Only the
    /// first thread's first key is made at the process's priority, every other at
    /// [`REFILL_NICE`].
    pub fn start(ready: usize, generators: usize) -> RsaKeyPool {
        let ready_target = ready.max(1);
        let generators = generators.clamp(1, ready_target);
        // Each generator blocked in `send` holds one key; the channel's capacity holds the rest.
        let (sender, receiver) = sync_channel(ready_target - generators);
        let count = Arc::new(AtomicUsize::new(0));
        let mut started = 0;
        for _ in 0..generators {
            let (sender, count) = (sender.clone(), Arc::clone(&count));
            // The first thread's first key is the one a boot waits for.
            let full_priority_keys = usize::from(started == 0);
            let spawned = std::thread::Builder::new()
                .name("one-shot-rsa".into())
                .spawn(move || generate_forever(&sender, &count, full_priority_keys));
            started += usize::from(spawned.is_ok());
        }
        RsaKeyPool { receiver: (started > 0).then(|| Mutex::new(receiver)), ready: count }
    }

    /// A pool without a background thread: every [`take`](Self::take) generates a key.
    pub fn on_demand() -> RsaKeyPool {
        RsaKeyPool { receiver: None, ready: Arc::new(AtomicUsize::new(0)) }
    }

    /// Takes a key, waiting for the generators if none is ready.
    pub fn take(&self) -> Result<OneShotKey, KeyGenerationError> {
        let Some(receiver) = &self.receiver else { return OneShotKey::generate() };
        let received = {
            let receiver = receiver.lock().map_err(|_| poisoned())?;
            receiver.recv()
        };
        match received {
            Ok(generated) => self.delivered(generated),
            // Every generator stopped (they panicked): generate here.
            Err(_) => OneShotKey::generate(),
        }
    }

    /// Like [`take`](Self::take), giving up after `timeout` when the generators have no key.
    pub fn take_timeout(&self, timeout: Duration) -> Result<OneShotKey, KeyGenerationError> {
        let Some(receiver) = &self.receiver else { return OneShotKey::generate() };
        let deadline = Instant::now() + timeout;
        let received = {
            let receiver = receiver.lock().map_err(|_| poisoned())?;
            receiver.recv_timeout(deadline.saturating_duration_since(Instant::now()))
        };
        match received {
            Ok(generated) => self.delivered(generated),
            Err(RecvTimeoutError::Timeout) => {
                Err(KeyGenerationError(format!("no one-shot key within {timeout:?}")))
            }
            Err(RecvTimeoutError::Disconnected) => OneShotKey::generate(),
        }
    }

    fn delivered(&self, generated: Result<OneShotKey, String>) -> Result<OneShotKey, KeyGenerationError> {
        self.ready.fetch_sub(1, Ordering::SeqCst);
        generated.map_err(KeyGenerationError)
    }

    /// Keys generated and waiting.
    pub fn ready(&self) -> usize {
        self.ready.load(Ordering::SeqCst)
    }
}

fn poisoned() -> KeyGenerationError {
    KeyGenerationError("key pool lock poisoned".into())
}

/// The nice value of a generator after its first key.
const REFILL_NICE: i32 = 10;

/// Generates keys into `sender` until the pool is dropped: the first `full_priority_keys` at the
/// process's priority, every other at [`REFILL_NICE`], so that on an enclave's few vCPUs they
/// take the time the model's decryption and the embedding leave idle rather than a share of theirs.
fn generate_forever(sender: &SyncSender<Result<OneShotKey, String>>, ready: &AtomicUsize, full_priority_keys: usize) {
    for made in 0.. {
        if made == full_priority_keys {
            // Linux keeps a nice value per thread: this lowers this thread only. A refusal
            // leaves the refills at the process's priority, as fast and only less polite.
            let _ = rustix::process::setpriority_process(None, REFILL_NICE);
        }
        let key = OneShotKey::generate().map_err(|e| e.to_string());
        let failed = key.is_err();
        // Count before sending, so `take` never sees the counter below zero.
        ready.fetch_add(1, Ordering::SeqCst);
        let outcome = match sender.try_send(key) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(key)) => sender.send(key).map_err(|_| ()),
            Err(TrySendError::Disconnected(_)) => Err(()),
        };
        if outcome.is_err() || failed {
            // The pool was dropped (the unsent key is dropped and zeroized here), or the RNG
            // failed: the error was delivered, stop.
            return;
        }
    }
}
