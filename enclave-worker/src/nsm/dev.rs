//! The development NSM (DESIGN.md §4, "Locally there is no NSM").
//!
//! Documents have exactly the real shape (untagged COSE_Sign1, ES384, 16 PCRs of 48 bytes,
//! `cabundle` = [root, intermediate], fresh P-384 leaf per document) and are signed by the
//! development CA of `protocol::attestation::dev_issuer`. Only the root differs from production,
//! and the verifier labels it a development root.
//!
//! # Measurements
//!
//! | PCR | value |
//! |---|---|
//! | 0 | SHA-384 of the running worker binary (`/proc/self/exe`, else `std::env::current_exe()`), or of the file given to [`DevNsm::open_measuring`] |
//! | 1 | SHA-384 of the ASCII label [`DEV_KERNEL_LABEL`] = `ephem-batch development kernel v1` |
//! | 2 | SHA-384 of the ASCII label [`DEV_APPLICATION_LABEL`] = `ephem-batch development application v1` |
//! | 3..=15 | 48 zero bytes (PCR8, the signing-certificate PCR, is zero: development images are unsigned) |
//!
//! So PCR1 = `85d308c3d995c1e5f305205100b79dc0cc90b7deebe17c29756f3cb77cc61482e7e58b6a5280d8f069967778a1c153ec`
//! and PCR2 = `bd0e9e688c4c4dfc025f5e5626b124266697d6adeca9f694fd5de3dd68fc4fdaf4ce44b8ba6e6ecca2208f317799919c`
//! (`printf %s '<label>' | sha384sum`; pinned by the unit test `pcr_labels_known_answers`). A
//! client computes the PCR0 it expects with `sha384sum <worker binary>`.
//!
//! `module_id` is `i-dev00000000000000-enc<16 random hex digits>`, new for every [`DevNsm`]
//! (as a real enclave gets a new one per launch). The clock is the system clock.
//!
//! # State directory
//!
//! The CA is created on first use and kept in the directory the caller names:
//!
//! ```text
//! <state>/dev-root.pem                   the root certificate (PEM): what clients pin
//! <state>/dev-ca/root.pem                root certificate
//! <state>/dev-ca/root.key.pem            root private key, PKCS#8 PEM, mode 0600
//! <state>/dev-ca/intermediate.pem        intermediate certificate
//! <state>/dev-ca/intermediate.key.pem    intermediate private key, PKCS#8 PEM, mode 0600
//! ```
//!
//! `dev-ca/` is written into a temporary directory and renamed into place, so two workers
//! starting at once on an empty directory agree on one CA (the loser of the rename loads the
//! winner's). On load, keys and certificates are checked to belong together
//! (`DevIssuer::import`), and `dev-root.pem` is rewritten if it is missing or differs.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use der::pem::LineEnding;
use protocol::attestation::dev_issuer::{development_pcrs, PCR_COUNT, PCR_LEN};
use protocol::attestation::{DevIssuer, DevIssuerKeys, DocumentRequest, TrustAnchor};
use sha2::{Digest, Sha384};
use zeroize::Zeroizing;

use super::{AttestationRequest, Nsm, NsmError, system_now_ms};

pub use protocol::attestation::dev_issuer::{DEV_APPLICATION_LABEL, DEV_KERNEL_LABEL};
/// File name of the development root certificate in the state directory.
pub const DEV_ROOT_PEM: &str = "dev-root.pem";
/// Sub-directory of the state directory holding the CA.
pub const DEV_CA_DIR: &str = "dev-ca";

const ROOT_CERT: &str = "root.pem";
const ROOT_KEY: &str = "root.key.pem";
const INTERMEDIATE_CERT: &str = "intermediate.pem";
const INTERMEDIATE_KEY: &str = "intermediate.key.pem";

/// SHA-384 of [`DEV_KERNEL_LABEL`].
pub fn dev_pcr1() -> [u8; PCR_LEN] {
    development_pcrs([0; PCR_LEN])[1]
}

/// SHA-384 of [`DEV_APPLICATION_LABEL`].
pub fn dev_pcr2() -> [u8; PCR_LEN] {
    development_pcrs([0; PCR_LEN])[2]
}

/// SHA-384 of a file's bytes (streamed).
pub fn measure_file(path: &Path) -> Result<[u8; PCR_LEN], NsmError> {
    let mut file =
        fs::File::open(path).map_err(|e| NsmError::Measurement(format!("opening {}: {e}", path.display())))?;
    let mut hasher = Sha384::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buffer)
            .map_err(|e| NsmError::Measurement(format!("reading {}: {e}", path.display())))?;
        if n == 0 {
            break;
        }
        hasher.update(buffer.get(..n).unwrap_or_default());
    }
    Ok(hasher.finalize().into())
}

/// SHA-384 of the running executable: `/proc/self/exe` (the inode actually running, even if the
/// file was replaced since), else `std::env::current_exe()`.
pub fn measure_running_binary() -> Result<[u8; PCR_LEN], NsmError> {
    let proc_exe = Path::new("/proc/self/exe");
    if proc_exe.exists() {
        return measure_file(proc_exe);
    }
    let exe = std::env::current_exe().map_err(|e| NsmError::Measurement(format!("current_exe: {e}")))?;
    measure_file(&exe)
}

/// The 16 PCRs of the development NSM for a given PCR0.
pub fn dev_pcrs(pcr0: [u8; PCR_LEN]) -> [[u8; PCR_LEN]; PCR_COUNT] {
    development_pcrs(pcr0)
}

/// The development NSM. See the module documentation.
pub struct DevNsm {
    issuer: DevIssuer,
    anchor: TrustAnchor,
    module_id: String,
    pcr_values: [[u8; PCR_LEN]; PCR_COUNT],
    pcrs: BTreeMap<u8, Vec<u8>>,
    state_dir: PathBuf,
}

impl core::fmt::Debug for DevNsm {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DevNsm")
            .field("module_id", &self.module_id)
            .field("root", &self.anchor.label())
            .field("pcr0", &hex::encode(self.pcr_values[0]))
            .field("state_dir", &self.state_dir)
            .finish()
    }
}

impl DevNsm {
    /// Opens (creating on first use) the development CA in `state_dir`; PCR0 measures the running
    /// worker binary.
    pub fn open(state_dir: impl AsRef<Path>) -> Result<DevNsm, NsmError> {
        let pcr0 = measure_running_binary()?;
        DevNsm::with_pcr0(state_dir.as_ref(), pcr0)
    }

    /// As [`open`](Self::open), with PCR0 = SHA-384 of `image` instead of the running binary.
    pub fn open_measuring(state_dir: impl AsRef<Path>, image: &Path) -> Result<DevNsm, NsmError> {
        let pcr0 = measure_file(image)?;
        DevNsm::with_pcr0(state_dir.as_ref(), pcr0)
    }

    fn with_pcr0(state_dir: &Path, pcr0: [u8; PCR_LEN]) -> Result<DevNsm, NsmError> {
        let issuer = load_or_create_ca(state_dir, system_now_ms())?;
        let anchor = issuer.trust_anchor().map_err(|e| NsmError::DevState(e.to_string()))?;
        let module_id = format!("i-dev00000000000000-enc{}", random_tag()?);
        let pcr_values = dev_pcrs(pcr0);
        let pcrs = (0u8..).zip(pcr_values.iter()).map(|(i, v)| (i, v.to_vec())).collect();
        Ok(DevNsm { issuer, anchor, module_id, pcr_values, pcrs, state_dir: state_dir.to_path_buf() })
    }

    /// The development root certificate (DER): what clients pin for local runs.
    pub fn root_der(&self) -> &[u8] {
        self.issuer.root_der()
    }

    /// Where the root certificate was written (PEM).
    pub fn root_pem_path(&self) -> PathBuf {
        self.state_dir.join(DEV_ROOT_PEM)
    }

    pub fn module_id(&self) -> &str {
        &self.module_id
    }

    /// PCR0 (SHA-384 of the measured binary).
    pub fn pcr0(&self) -> [u8; PCR_LEN] {
        self.pcr_values[0]
    }
}

impl Nsm for DevNsm {
    fn attest(&self, request: AttestationRequest) -> Result<Vec<u8>, NsmError> {
        let AttestationRequest { public_key, user_data, nonce } = request;
        let document_request =
            DocumentRequest { module_id: self.module_id.clone(), pcrs: self.pcr_values, public_key, user_data, nonce };
        self.issuer.attest(&document_request, system_now_ms()).map_err(|e| NsmError::Request(e.to_string()))
    }

    fn pcrs(&self) -> &BTreeMap<u8, Vec<u8>> {
        &self.pcrs
    }

    fn now_ms(&self) -> u64 {
        system_now_ms()
    }

    fn trust_anchor(&self) -> TrustAnchor {
        self.anchor.clone()
    }

    fn is_development(&self) -> bool {
        true
    }
}

fn state_error(what: &str, path: &Path, e: impl core::fmt::Display) -> NsmError {
    NsmError::DevState(format!("{what} {}: {e}", path.display()))
}

fn load_or_create_ca(state_dir: &Path, now_ms: u64) -> Result<DevIssuer, NsmError> {
    fs::create_dir_all(state_dir).map_err(|e| state_error("creating", state_dir, e))?;
    let ca_dir = state_dir.join(DEV_CA_DIR);
    if !ca_dir.exists() {
        create_ca(state_dir, &ca_dir, now_ms)?;
    }
    let keys = DevIssuerKeys {
        root_key_pkcs8: read_pem(&ca_dir.join(ROOT_KEY), "PRIVATE KEY")?,
        root_cert_der: read_pem(&ca_dir.join(ROOT_CERT), "CERTIFICATE")?.to_vec(),
        intermediate_key_pkcs8: read_pem(&ca_dir.join(INTERMEDIATE_KEY), "PRIVATE KEY")?,
        intermediate_cert_der: read_pem(&ca_dir.join(INTERMEDIATE_CERT), "CERTIFICATE")?.to_vec(),
    };
    let issuer = DevIssuer::import(&keys).map_err(|e| state_error("loading the CA in", &ca_dir, e))?;
    if issuer.valid_until_ms() <= now_ms {
        return Err(NsmError::DevState(format!(
            "the development CA in {} expired; remove that directory (and re-pin the new {DEV_ROOT_PEM})",
            ca_dir.display()
        )));
    }
    let root_pem = pem("CERTIFICATE", issuer.root_der())?;
    let root_path = state_dir.join(DEV_ROOT_PEM);
    if fs::read(&root_path).ok().as_deref() != Some(root_pem.as_bytes()) {
        let tmp = state_dir.join(format!(".{DEV_ROOT_PEM}.tmp-{}-{}", std::process::id(), random_tag()?));
        write_file(&tmp, root_pem.as_bytes(), 0o644)?;
        fs::rename(&tmp, &root_path).map_err(|e| state_error("writing", &root_path, e))?;
    }
    Ok(issuer)
}

fn create_ca(state_dir: &Path, ca_dir: &Path, now_ms: u64) -> Result<(), NsmError> {
    let issuer = DevIssuer::generate(now_ms).map_err(|e| NsmError::DevState(format!("generating the CA: {e}")))?;
    let keys = issuer.export().map_err(|e| NsmError::DevState(format!("exporting the CA: {e}")))?;
    let tmp = state_dir.join(format!(".{DEV_CA_DIR}.tmp-{}-{}", std::process::id(), random_tag()?));
    fs::DirBuilder::new().mode(0o700).create(&tmp).map_err(|e| state_error("creating", &tmp, e))?;
    let written = (|| {
        write_file(&tmp.join(ROOT_KEY), pem("PRIVATE KEY", &keys.root_key_pkcs8)?.as_bytes(), 0o600)?;
        write_file(&tmp.join(ROOT_CERT), pem("CERTIFICATE", &keys.root_cert_der)?.as_bytes(), 0o644)?;
        write_file(&tmp.join(INTERMEDIATE_KEY), pem("PRIVATE KEY", &keys.intermediate_key_pkcs8)?.as_bytes(), 0o600)?;
        write_file(&tmp.join(INTERMEDIATE_CERT), pem("CERTIFICATE", &keys.intermediate_cert_der)?.as_bytes(), 0o644)
    })();
    let outcome = written.and_then(|()| match fs::rename(&tmp, ca_dir) {
        Ok(()) => Ok(()),
        // Another process created it first: use theirs.
        Err(_) if ca_dir.join(ROOT_CERT).exists() => Ok(()),
        Err(e) => Err(state_error("renaming into", ca_dir, e)),
    });
    if tmp.exists() {
        let _ = fs::remove_dir_all(&tmp);
    }
    outcome
}

/// 16 random hex digits, for temporary names unique across processes and threads.
fn random_tag() -> Result<String, NsmError> {
    let mut tag = [0u8; 8];
    getrandom::fill(&mut tag).map_err(|e| NsmError::Unavailable(format!("OS random number generator: {e}")))?;
    Ok(hex::encode(tag))
}

fn pem(label: &str, der: &[u8]) -> Result<Zeroizing<String>, NsmError> {
    der::pem::encode_string(label, LineEnding::LF, der)
        .map(Zeroizing::new)
        .map_err(|e| NsmError::DevState(format!("PEM encoding: {e}")))
}

fn read_pem(path: &Path, label: &str) -> Result<Zeroizing<Vec<u8>>, NsmError> {
    let text = Zeroizing::new(fs::read(path).map_err(|e| state_error("reading", path, e))?);
    let (found, der) = der::pem::decode_vec(&text).map_err(|e| state_error("decoding", path, e))?;
    let der = Zeroizing::new(der);
    if found != label {
        return Err(state_error("reading", path, format!("PEM label {found:?}, expected {label:?}")));
    }
    Ok(der)
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), NsmError> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(|e| state_error("writing", path, e))?;
    file.write_all(bytes).and_then(|()| file.sync_all()).map_err(|e| state_error("writing", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::attestation::{AttestationDocument, RootKind, VerifyOptions, verify};

    #[test]
    fn pcr_labels_known_answers() {
        assert_eq!(
            hex::encode(dev_pcr1()),
            "85d308c3d995c1e5f305205100b79dc0cc90b7deebe17c29756f3cb77cc61482e7e58b6a5280d8f069967778a1c153ec"
        );
        assert_eq!(
            hex::encode(dev_pcr2()),
            "bd0e9e688c4c4dfc025f5e5626b124266697d6adeca9f694fd5de3dd68fc4fdaf4ce44b8ba6e6ecca2208f317799919c"
        );
    }

    #[test]
    fn creates_then_reloads_the_same_ca() {
        let dir = tempfile::tempdir().unwrap();
        let first = DevNsm::open(dir.path()).unwrap();
        let pem_text = fs::read_to_string(dir.path().join(DEV_ROOT_PEM)).unwrap();
        assert_eq!(TrustAnchor::from_pem(&pem_text).unwrap().der(), first.root_der());
        assert_eq!(first.trust_anchor().kind(), RootKind::Development);
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(dir.path().join(DEV_CA_DIR).join(ROOT_KEY)).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "private key readable by others: {mode:o}");

        let second = DevNsm::open(dir.path()).unwrap();
        assert_eq!(second.root_der(), first.root_der());
        assert_ne!(second.module_id(), first.module_id());
        // dev-root.pem is restored if removed.
        fs::remove_file(dir.path().join(DEV_ROOT_PEM)).unwrap();
        let third = DevNsm::open(dir.path()).unwrap();
        assert_eq!(fs::read_to_string(third.root_pem_path()).unwrap(), pem_text);
        // No temporary directories left behind.
        let names: Vec<String> =
            fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn concurrent_first_use_agrees_on_one_ca() {
        let dir = tempfile::tempdir().unwrap();
        let roots: Vec<Vec<u8>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| DevNsm::open_measuring(dir.path(), Path::new("/proc/self/exe")).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap().root_der().to_vec()).collect()
        });
        assert!(roots.windows(2).all(|w| w[0] == w[1]));
        let pinned = TrustAnchor::from_pem(&fs::read_to_string(dir.path().join(DEV_ROOT_PEM)).unwrap()).unwrap();
        assert_eq!(pinned.der(), roots[0].as_slice());
    }

    #[test]
    fn damaged_state_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        DevNsm::open(dir.path()).unwrap();
        let other = tempfile::tempdir().unwrap();
        DevNsm::open(other.path()).unwrap();
        // A root key that does not belong to the root certificate.
        fs::copy(other.path().join(DEV_CA_DIR).join(ROOT_KEY), dir.path().join(DEV_CA_DIR).join(ROOT_KEY)).unwrap();
        let err = DevNsm::open(dir.path()).unwrap_err();
        assert_eq!(err.check(), "dev_state", "{err}");
        // A certificate file with the wrong PEM label.
        fs::write(dir.path().join(DEV_CA_DIR).join(ROOT_CERT), "-----BEGIN FOO-----\nAAAA\n-----END FOO-----\n").unwrap();
        assert_eq!(DevNsm::open(dir.path()).unwrap_err().check(), "dev_state");
    }

    #[test]
    fn documents_have_the_real_shape_and_verify() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("image.bin");
        fs::write(&image, b"pretend worker binary").unwrap();
        let nsm = DevNsm::open_measuring(dir.path().join("state"), &image).unwrap();
        let pcr0: [u8; 48] = Sha384::digest(b"pretend worker binary").into();
        assert_eq!(nsm.pcr0(), pcr0);
        assert!(nsm.is_development());
        let fleet = protocol::envelope::FleetSecretKey::generate();
        let receipt = ed25519_dalek::SigningKey::from_bytes(&[3; 32]);
        let binding = super::super::own_binding(&fleet, &receipt, 9, 1_800_000_000_000, &super::super::test_kms_key()).unwrap();
        let doc = nsm.attest(AttestationRequest::fresh(&binding, b"n0nce").unwrap()).unwrap();
        let now = nsm.now_ms();
        let mut options = VerifyOptions::new(nsm.trust_anchor(), now).expect_pcr(0, pcr0.to_vec());
        options.expected_pcrs.insert(1, dev_pcr1().to_vec());
        options.expected_pcrs.insert(2, dev_pcr2().to_vec());
        options.expected_nonce = Some(b"n0nce".to_vec());
        options.require_binding = true;
        let verified = verify(&doc, &options).unwrap();
        assert_eq!(verified.binding.as_ref(), Some(&binding));
        assert!(!verified.debug_mode);
        let parsed = AttestationDocument::parse_unverified(&doc).unwrap();
        assert_eq!(parsed.module_id, nsm.module_id());
        assert!(parsed.module_id.starts_with("i-dev00000000000000-enc") && parsed.module_id.len() == 39);
        assert_eq!(parsed.pcrs.len(), 16);
        assert_eq!(parsed.pcr(8), Some(&[0u8; 48][..]));
        assert_eq!(&parsed.pcrs, nsm.pcrs());
        assert_eq!(parsed.public_key, None);
        assert!(parsed.timestamp_ms.abs_diff(now) < 60_000);
    }

    #[test]
    fn running_binary_measurement() {
        let exe = std::env::current_exe().unwrap();
        assert_eq!(measure_running_binary().unwrap(), measure_file(&exe).unwrap());
        assert_eq!(measure_file(Path::new("/nonexistent/worker")).unwrap_err().check(), "measurement");
    }
}
