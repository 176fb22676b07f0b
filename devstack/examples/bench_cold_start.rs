//! Cold-start benchmark of the real worker process: N boots of `enclave-worker`, each measured
//! from spawn to "ready with the model" — the time a new enclave takes before it can serve jobs.
//!
//! This program plays the host the way `host-poller` does in the embedded default: a local cloud
//! in a temporary home (`cloud_local`: the SQLite KMS with key policies bound to PCR0 = SHA-384
//! of the worker binary, served as the HTTPS endpoint the worker pins; model and fleet-key
//! objects on disk), provisioned as `ephem-batch dev up` does (fleet epoch 1, the model sealed
//! under a DEK wrapped by KMS, its manifest signed by the development publisher). For each boot
//! it spawns the worker, connects as soon as it listens, asks it to take up epoch 1 and to load
//! the model, answers its object and credential requests from the store (256 KiB frames, as the
//! relay streams them), and timestamps every step:
//!
//! | phase | from → to | what the worker does |
//! |---|---|---|
//! | `listen` | spawn → socket accepts | process start, development NSM (measures its binary), KMS TLS client, bind; starts RSA key generation in the background |
//! | `fleet_key` | `UseFleetEpoch` → status | epoch record, key release (one-shot RSA key, attestation document, TLS to KMS, `Decrypt` with `Recipient`, CMS open), publication document |
//! | `model_key` | `LoadModel` → first model file asked | manifest fetch + signature check, DEK release (second one-shot key) |
//! | `stream_decrypt` | first model file asked → last byte sent | files streamed in, decrypted and hashed as they arrive |
//! | `load` | last byte sent → status `ready` | last SHA-256 check, weights parsed into the encoder, engine started |
//! | `total` | spawn → ready | the cold start |
//!
//! `kms_fleet`/`kms_model` are the local KMS's own time inside each `Decrypt` (attestation
//! verification, policy, CMS sealing). One boot before the measured ones creates the development
//! CA in the state directory (as the first `dev up` does) and is not counted. Also reported: one
//! RSA-2048 key generation measured here (the worker needs two before the model's DEK) and the
//! worker's peak RSS when ready.
//!
//! ```text
//! cargo build --release -p enclave-worker -p devstack --bins --example bench_cold_start
//! target/release/examples/bench_cold_start [--boots 20] [--threads 2] [--worker PATH] [--json OUT]
//! ```
//!
//! The model comes from `EPHEM_MODEL_DIR` or `.ephem/models/all-MiniLM-L6-v2`
//! (`bash scripts/setup-model.sh`); the worker binary defaults to `enclave-worker` beside this
//! example's directory (`target/release/`). It lives with the embedded default, not in the
//! enclave crate: the trusted crate's tree never reaches the ports or the local adapters.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use enclave_worker::dev_model;
use cloud::kms::{DataKey, DataKeyPair, Decrypted, EncryptionContext};
use cloud_local::{KmsEndpoint, LocalCloud, LocalKeyPolicy, FLEET_KEY_ALIAS, MODEL_KEY_ALIAS};
use cloud::{layout, AwsCredentials, Kms, KmsError, ObjectStore, PutCondition, Recipient};
use enclave_worker::key_release::OneShotKey;
use protocol::fleet::{encryption_context, epoch_object_key, EpochRecord};
use protocol::frame::{read_frame, write_frame, Channel, Message, Role, MAX_DATA_LEN};
use protocol::manifest::{development_publisher, Manifest};
use sha2::{Digest, Sha384};

const BOOT_TIMEOUT: Duration = Duration::from_secs(120);

struct Args {
    boots: usize,
    threads: usize,
    worker: PathBuf,
    json: Option<PathBuf>,
}

fn usage(problem: &str) -> ! {
    eprintln!("{problem}\nusage: bench_cold_start [--boots 20] [--threads 2] [--worker PATH] [--json OUT]");
    std::process::exit(2)
}

fn parse_args() -> Args {
    let default_worker = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().and_then(Path::parent).map(|dir| dir.join("enclave-worker")))
        .unwrap_or_else(|| PathBuf::from("enclave-worker"));
    let mut args = Args { boots: 20, threads: 2, worker: default_worker, json: None };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--boots" => args.boots = value().parse().unwrap_or_else(|_| usage("--boots N")),
            "--threads" => args.threads = value().parse().unwrap_or_else(|_| usage("--threads N")),
            "--worker" => args.worker = PathBuf::from(value()),
            "--json" => args.json = Some(PathBuf::from(value())),
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    if !args.worker.is_file() {
        usage(&format!(
            "{} is missing: cargo build --release -p enclave-worker --bins (or pass --worker PATH)",
            args.worker.display()
        ));
    }
    args.boots = args.boots.max(1);
    args
}

/// The local KMS, with the start and end of every `Decrypt` it serves recorded.
struct TimedKms {
    inner: Arc<dyn Kms>,
    decrypts: Mutex<Vec<(Instant, Instant)>>,
}

impl TimedKms {
    fn take(&self) -> Vec<(Instant, Instant)> {
        std::mem::take(&mut *self.decrypts.lock().unwrap())
    }
}

impl Kms for TimedKms {
    fn enclave_access(&self) -> Result<AwsCredentials, KmsError> {
        self.inner.enclave_access()
    }
    fn encrypt(&self, key_id: &str, plaintext: &[u8], context: &EncryptionContext) -> Result<Vec<u8>, KmsError> {
        self.inner.encrypt(key_id, plaintext, context)
    }
    fn generate_data_key(&self, key_id: &str, context: &EncryptionContext, recipient: Option<&Recipient>) -> Result<DataKey, KmsError> {
        self.inner.generate_data_key(key_id, context, recipient)
    }
    fn generate_data_key_pair_without_plaintext(&self, key_id: &str, context: &EncryptionContext) -> Result<DataKeyPair, KmsError> {
        self.inner.generate_data_key_pair_without_plaintext(key_id, context)
    }
    fn decrypt(
        &self,
        key_id: Option<&str>,
        blob: &[u8],
        context: &EncryptionContext,
        recipient: Option<&Recipient>,
    ) -> Result<Decrypted, KmsError> {
        let started = Instant::now();
        let answer = self.inner.decrypt(key_id, blob, context, recipient);
        self.decrypts.lock().unwrap().push((started, Instant::now()));
        answer
    }
}

/// What `ephem-batch dev up` puts in place: KMS keys bound to the worker's PCR0, fleet epoch 1,
/// the sealed model and its signed manifest. Returns the manifest's object key.
fn provision(local: &LocalCloud, worker: &Path) -> String {
    let pcr0 = Sha384::digest(std::fs::read(worker).expect("read worker binary")).to_vec();
    let kms = local.kms();
    let fleet_key = kms.create_key(LocalKeyPolicy::fleet(pcr0.clone(), None), "fleet keys (bench)").unwrap();
    kms.set_alias(FLEET_KEY_ALIAS, &fleet_key).unwrap();
    let model_key = kms.create_key(LocalKeyPolicy::model(pcr0, None), "model keys (bench)").unwrap();
    kms.set_alias(MODEL_KEY_ALIAS, &model_key).unwrap();

    let not_after_ms = cloud::now_ms() + 24 * 3_600_000;
    let pair = kms.generate_data_key_pair_without_plaintext(&fleet_key, &encryption_context(1, not_after_ms)).unwrap();
    let public = <p256::PublicKey as p256::pkcs8::DecodePublicKey>::from_public_key_der(&pair.public_key_der).unwrap();
    let point = p256::elliptic_curve::sec1::ToSec1Point::to_sec1_point(&public, false);
    let record = EpochRecord {
        epoch: 1,
        not_after_ms,
        kms_key_id: pair.key_id,
        public_key: hex::encode(point.as_bytes()),
        wrapped_private_key: hex::encode(&pair.private_key_ciphertext_blob),
    };
    local.attestations_store().put(&epoch_object_key(1), record.to_json().as_bytes(), PutCondition::CreateOnly).unwrap();

    let files = dev_model::read_files(&dev_model::model_dir());
    let mut dek = [0u8; 32];
    getrandom::fill(&mut dek).unwrap();
    let context = [("model_id".to_owned(), dev_model::MODEL_ID.to_owned()), ("version".to_owned(), "1".to_owned())].into_iter().collect();
    let wrapped_dek = kms.encrypt(&model_key, &dek, &context).unwrap();
    let manifest = dev_model::manifest(1, &files, &model_key, wrapped_dek, cloud::now_ms());
    let manifest_key = layout::model_manifest(dev_model::MODEL_ID, 1);
    let models = local.models_store();
    for (name, sealed) in dev_model::seal(&manifest, &dek, &files) {
        models.put(&Manifest::file_object_key(&manifest_key, &name), &sealed, PutCondition::CreateOnly).unwrap();
    }
    models.put(&manifest_key, &manifest.sign(&development_publisher()), PutCondition::CreateOnly).unwrap();
    manifest_key
}

/// The host's side of one boot's control connection, with its timestamps.
struct Host {
    models: Arc<dyn ObjectStore>,
    attestations: Arc<dyn ObjectStore>,
    access: AwsCredentials,
    manifest_key: String,
    first_file_asked: Option<Instant>,
    last_file_byte: Option<Instant>,
}

impl Host {
    /// Streams an object to the worker in frames of at most `MAX_DATA_LEN`, reading the store as
    /// it goes (one chunk of look-ahead, so the last frame says so).
    fn send_object(&mut self, connection: &mut UnixStream, request: u64, key: &str) {
        let store = if key.starts_with(layout::MODELS_PREFIX) { &self.models } else { &self.attestations };
        let is_model_file = key != self.manifest_key && key.starts_with(layout::MODELS_PREFIX);
        if is_model_file && self.first_file_asked.is_none() {
            self.first_file_asked = Some(Instant::now());
        }
        let mut reader = match store.reader(key) {
            Ok(reader) => reader,
            Err(error) => {
                write_frame(connection, &Message::ObjectMissing { request, message: error.to_string() }).unwrap();
                return;
            }
        };
        let mut read_chunk = |buffer: &mut Vec<u8>| {
            buffer.resize(MAX_DATA_LEN, 0);
            let mut filled = 0;
            while filled < MAX_DATA_LEN {
                match std::io::Read::read(&mut reader, &mut buffer[filled..]).unwrap() {
                    0 => break,
                    n => filled += n,
                }
            }
            buffer.truncate(filled);
        };
        let (mut current, mut next) = (Vec::new(), Vec::new());
        read_chunk(&mut current);
        loop {
            read_chunk(&mut next);
            let last = next.is_empty();
            write_frame(connection, &Message::ObjectData { request, data: std::mem::take(&mut current), last }).unwrap();
            if last {
                break;
            }
            std::mem::swap(&mut current, &mut next);
        }
        connection.flush().unwrap();
        if is_model_file {
            self.last_file_byte = Some(Instant::now());
        }
    }

    /// Answers the worker until it reports a status; panics on an error.
    fn serve(&mut self, connection: &mut UnixStream) -> bool {
        loop {
            match read_frame(connection).unwrap().expect("worker closed the control connection") {
                Message::FetchObject { request, key } => self.send_object(connection, request, &key),
                Message::KmsCredentialsRequest { request } => {
                    let answer = Message::KmsCredentials {
                        request,
                        region: self.access.region.clone(),
                        access_key_id: self.access.access_key_id.clone(),
                        secret_access_key: self.access.secret_access_key.to_string(),
                        session_token: self.access.session_token.clone(),
                    };
                    write_frame(connection, &answer).unwrap();
                    connection.flush().unwrap();
                }
                Message::PublishAttestation { .. } => {}
                Message::Status { ready, .. } => return ready,
                Message::Error { message } => panic!("the worker refused: {message}"),
                other => panic!("unexpected message from the worker: {other:?}"),
            }
        }
    }
}

struct Worker {
    child: Child,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn peak_rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse::<f64>().ok()))
        })
        .map(|kib| kib / 1024.0)
        .unwrap_or(0.0)
}

/// One boot's phases in milliseconds, and the worker's peak RSS.
type Sample = BTreeMap<&'static str, f64>;

fn boot(args: &Args, home: &Path, kms_relay: &Path, kms_root: &Path, host: &mut Host, kms: &TimedKms) -> Sample {
    let socket = home.join("run").join("worker.sock");
    let _ = std::fs::remove_file(&socket);
    let log = std::fs::OpenOptions::new().create(true).append(true).open(home.join("enclave-worker.log")).unwrap();
    kms.take();
    host.first_file_asked = None;
    host.last_file_byte = None;

    let spawned = Instant::now();
    let child = Command::new(&args.worker)
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .arg("--kms-relay")
        .arg(format!("unix:{}", kms_relay.display()))
        .arg("--kms-tls-root")
        .arg(kms_root)
        .arg("--state-dir")
        .arg(home.join("enclave"))
        .arg("--threads")
        .arg(args.threads.to_string())
        .env("RAYON_NUM_THREADS", args.threads.to_string())
        .env("CANDLE_NUM_THREADS", args.threads.to_string())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", args.worker.display()));
    let worker = Worker { child };
    let mut connection = loop {
        if let Ok(connection) = UnixStream::connect(&socket) {
            break connection;
        }
        assert!(spawned.elapsed() < BOOT_TIMEOUT, "the worker did not listen within {BOOT_TIMEOUT:?}");
        std::thread::sleep(Duration::from_millis(1));
    };
    let listening = Instant::now();
    write_frame(&mut connection, &Message::Hello { role: Role::Host, channel: Channel::Control }).unwrap();
    connection.flush().unwrap();
    assert_eq!(
        read_frame(&mut connection).unwrap(),
        Some(Message::Hello { role: Role::Enclave, channel: Channel::Control })
    );

    let epoch_asked = Instant::now();
    write_frame(&mut connection, &Message::UseFleetEpoch { epoch: 1, object_key: epoch_object_key(1) }).unwrap();
    connection.flush().unwrap();
    host.serve(&mut connection);
    let epoch_done = Instant::now();

    write_frame(&mut connection, &Message::LoadModel { manifest_key: host.manifest_key.clone() }).unwrap();
    connection.flush().unwrap();
    let ready = host.serve(&mut connection);
    let ready_at = Instant::now();
    assert!(ready, "the worker loaded the model but does not report ready");
    let rss = peak_rss_mib(worker.child.id());
    drop(connection);
    drop(worker);

    let decrypts = kms.take();
    assert_eq!(decrypts.len(), 2, "expected two KMS Decrypt calls (fleet key, model DEK)");
    let first_file = host.first_file_asked.expect("no model file asked");
    let last_byte = host.last_file_byte.expect("no model file sent");
    let ms = |from: Instant, to: Instant| to.saturating_duration_since(from).as_secs_f64() * 1e3;
    [
        ("listen", ms(spawned, listening)),
        ("fleet_key", ms(epoch_asked, epoch_done)),
        ("model_key", ms(epoch_done, first_file)),
        ("stream_decrypt", ms(first_file, last_byte)),
        ("load", ms(last_byte, ready_at)),
        ("total", ms(spawned, ready_at)),
        ("kms_fleet", ms(decrypts[0].0, decrypts[0].1)),
        ("kms_model", ms(decrypts[1].0, decrypts[1].1)),
        ("peak_rss_mib", rss),
    ]
    .into_iter()
    .collect()
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

fn main() {
    let args = parse_args();
    let dir = tempfile::tempdir().expect("temporary home");
    let home = dir.path();
    let local = LocalCloud::open(home).expect("local cloud");
    let manifest_key = provision(&local, &args.worker);
    let services = local.services();
    let kms = Arc::new(TimedKms { inner: services.kms.clone(), decrypts: Mutex::new(Vec::new()) });
    let endpoint = KmsEndpoint::open(home, kms.clone()).expect("local KMS endpoint");
    let kms_root = endpoint.root_pem().to_path_buf();
    std::fs::create_dir_all(home.join("run")).unwrap();
    let kms_socket = home.join("run").join("kms.sock");
    endpoint.serve_unix(&kms_socket).expect("serve local KMS");
    let mut host = Host {
        models: services.models.clone(),
        attestations: services.attestations.clone(),
        access: services.kms.enclave_access().unwrap(),
        manifest_key,
        first_file_asked: None,
        last_file_byte: None,
    };
    let weights = std::fs::metadata(dev_model::model_dir().join("model.safetensors")).map(|m| m.len()).unwrap_or(0);
    println!(
        "cold start of {} ({} MB of weights), {} boots + 1 that creates the development CA, --threads {}",
        dev_model::MODEL_ID,
        weights / 1_000_000,
        args.boots,
        args.threads
    );

    let first = boot(&args, home, &kms_socket, &kms_root, &mut host, &kms);
    println!("first boot (creates the development CA, not counted): {:.0} ms", first["total"]);
    let mut samples = Vec::new();
    for i in 0..args.boots {
        let sample = boot(&args, home, &kms_socket, &kms_root, &mut host, &kms);
        println!(
            "boot {:>2}: total {:>6.0} ms  (listen {:>4.0}, fleet key {:>4.0}, model key {:>4.0}, stream-decrypt {:>4.0}, load {:>4.0}; \
             KMS {:.0} + {:.0})  peak RSS {:.0} MiB",
            i + 1,
            sample["total"],
            sample["listen"],
            sample["fleet_key"],
            sample["model_key"],
            sample["stream_decrypt"],
            sample["load"],
            sample["kms_fleet"],
            sample["kms_model"],
            sample["peak_rss_mib"],
        );
        samples.push(sample);
    }

    // One RSA-2048 key generation here, for scale: the worker needs two before the model's DEK.
    let mut keygen = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        drop(OneShotKey::generate().expect("RSA key"));
        keygen.push(started.elapsed().as_secs_f64() * 1e3);
    }
    keygen.sort_by(f64::total_cmp);

    let phases =
        ["listen", "fleet_key", "model_key", "stream_decrypt", "load", "total", "kms_fleet", "kms_model", "peak_rss_mib"];
    let mut summary = serde_json::Map::new();
    println!("\n{:<16} {:>9} {:>9} {:>9}   (ms; peak RSS in MiB)", "phase", "p50", "p95", "max");
    for phase in phases {
        let mut values: Vec<f64> = samples.iter().map(|s| s[phase]).collect();
        values.sort_by(f64::total_cmp);
        let (p50, p95, max) = (percentile(&values, 50.0), percentile(&values, 95.0), *values.last().unwrap());
        println!("{phase:<16} {p50:>9.1} {p95:>9.1} {max:>9.1}");
        summary.insert(phase.into(), serde_json::json!({ "p50": p50, "p95": p95, "max": max }));
    }
    println!("{:<16} {:>9.1}   (median of 5, measured here)", "rsa2048_keygen", percentile(&keygen, 50.0));

    if let Some(path) = &args.json {
        let doc = serde_json::json!({
            "model": dev_model::MODEL_ID,
            "weights_bytes": weights,
            "boots": args.boots,
            "threads": args.threads,
            "first_boot_ms": first["total"],
            "summary": summary,
            "rsa2048_keygen_ms_median": percentile(&keygen, 50.0),
            "samples": samples,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap() + "\n").expect("write json");
        println!("wrote {}", path.display());
    }
}
