//! `ephem-batch model encrypt | sign | upload | verify | set-minimum | upload-minimum`: onboarding a model directory, step by
//! step (the model owner signs offline; the upload needs only the models bucket). Signing keys
//! are Ed25519 seeds as 64 hex digits (`ephem-batch policy keygen` makes one).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, Context};
use clap::Subcommand;
use cloud::Services;
use ed25519_dalek::{SigningKey, VerifyingKey};

use crate::{model, model_choice};

#[derive(Subcommand, Debug)]
pub enum ModelCommand {
    /// Generate a data key, wrap it with KMS, seal every file of DIR into OUT_DIR and write the
    /// unsigned manifest.
    Encrypt {
        dir: PathBuf,
        #[arg(long)]
        model_id: String,
        #[arg(long)]
        version: u64,
        /// KMS key wrapping the data key (default: the deployment's model key).
        #[arg(long)]
        kms_key: Option<String>,
        #[arg(short, long, value_name = "OUT_DIR")]
        output: PathBuf,
        /// Shorter vector lengths the model was trained to keep meaning at (Matryoshka, e.g.
        /// `256,128,64`), which jobs may then ask for with `--dimensions`.
        #[arg(long, value_name = "N,M,…", value_delimiter = ',')]
        matryoshka: Vec<u32>,
        /// The enclave image whose model key KMS_KEY is (repeatable): a signed policy file
        /// (`dist/enclave/<commit>/policy.json`) or its PCR0 in hex. Clients then seal to this
        /// version only for that image, and hosts of other images keep the version they hold
        /// (an image update, docs/operations.md §4).
        #[arg(long = "for-image", value_name = "POLICY_OR_PCR0")]
        for_image: Vec<String>,
    },
    /// Sign OUT_DIR's manifest with the model publisher's key.
    Sign {
        out_dir: PathBuf,
        /// The publisher's Ed25519 seed (64 hex digits).
        #[arg(long, value_name = "FILE", conflicts_with = "development")]
        key: Option<PathBuf>,
        /// Sign with the well-known development publisher (accepted only by development workers).
        #[arg(long)]
        development: bool,
    },
    /// Upload OUT_DIR's sealed files and signed manifest to the models store.
    Upload { out_dir: PathBuf },
    /// Sign the lowest version of MODEL_ID clients may use (they refuse older manifests; check
    /// `model_minimum`) and upload it, or with --output only write it (to upload-minimum later).
    SetMinimum {
        #[arg(long)]
        model_id: String,
        /// The lowest version clients may use; it must be published.
        #[arg(long, value_name = "N")]
        minimum: u64,
        /// The publisher's Ed25519 seed (64 hex digits), the manifests' signing key.
        #[arg(long, value_name = "FILE", conflicts_with = "development")]
        key: Option<PathBuf>,
        /// Sign with the well-known development publisher.
        #[arg(long)]
        development: bool,
        /// Only write the signed minimum to FILE (signing offline; upload-minimum uploads it).
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Upload a minimum signed by set-minimum --output.
    UploadMinimum { file: PathBuf },
    /// Check a signed manifest (a file, or `--published KEY` in the models store, with its files).
    Verify {
        #[arg(required_unless_present = "published")]
        manifest: Option<PathBuf>,
        #[arg(long, value_name = "KEY")]
        published: Option<String>,
        /// The publisher's Ed25519 public key (64 hex digits).
        #[arg(long, value_name = "HEX", conflicts_with = "development")]
        publisher_key: Option<String>,
        #[arg(long)]
        development: bool,
    },
}

fn signing_key(key: Option<PathBuf>, development: bool) -> anyhow::Result<SigningKey> {
    match (key, development) {
        (_, true) => Ok(protocol::manifest::development_publisher()),
        (Some(path), false) => crate::keys::read_signing_key(&path),
        (None, false) => Err(anyhow!("pass --key FILE (or --development for the local stack)")),
    }
}

fn verifying_key(hex_key: Option<String>, development: bool) -> anyhow::Result<VerifyingKey> {
    match (hex_key, development) {
        (_, true) => Ok(protocol::manifest::development_publisher().verifying_key()),
        (Some(text), false) => crate::trust::parse_key(&text, "--publisher-key"),
        (None, false) => Err(anyhow!("pass --publisher-key HEX (or --development for the local stack)")),
    }
}

pub fn run(command: ModelCommand, services: &Services) -> anyhow::Result<ExitCode> {
    match command {
        ModelCommand::Encrypt { dir, model_id, version, kms_key, output, matryoshka, for_image } => {
            let key = kms_key.unwrap_or_else(|| services.keys.model.clone());
            let images = for_image.iter().map(|given| image_pcr0(given)).collect::<anyhow::Result<_>>()?;
            let offering = model::Offering { matryoshka, images };
            let manifest = model::encrypt_offering(&dir, &model_id, version, &offering, services.kms.as_ref(), &key, &output)?;
            println!("sealed {} v{} ({} files) into {}", manifest.model_id, manifest.version, manifest.files.len(), output.display());
        }
        ModelCommand::Sign { out_dir, key, development } => {
            let signed = model::sign(&out_dir, &signing_key(key, development)?)?;
            println!("signed manifest {}", hex::encode(signed.manifest_hash));
        }
        ModelCommand::Upload { out_dir } => {
            let key = model::upload(&out_dir, services.models.as_ref())?;
            println!("uploaded {key}");
        }
        ModelCommand::SetMinimum { model_id, minimum, key, development, output } => {
            let signed = model_choice::sign_minimum(&model_id, minimum, &signing_key(key, development)?, cloud::now_ms());
            match output {
                Some(path) => {
                    std::fs::write(&path, &signed).with_context(|| format!("writing {}", path.display()))?;
                    println!("signed minimum {model_id} v{minimum} into {}", path.display());
                }
                None => println!("uploaded {} (minimum {model_id} v{minimum})", model_choice::upload_minimum(services.models.as_ref(), &signed)?),
            }
        }
        ModelCommand::UploadMinimum { file } => {
            let signed = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            println!("uploaded {}", model_choice::upload_minimum(services.models.as_ref(), &signed)?);
        }
        ModelCommand::Verify { manifest, published, publisher_key, development } => {
            let publisher = verifying_key(publisher_key, development)?;
            let verified = match (&manifest, &published) {
                (_, Some(key)) => {
                    let bytes = services.models.get(key)?;
                    model::verify(&bytes, &publisher, Some((services.models.as_ref(), key)))?
                }
                (Some(path), None) => {
                    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
                    model::verify(&bytes, &publisher, None)?
                }
                (None, None) => unreachable!("clap requires one"),
            };
            let m = &verified.manifest;
            println!("valid: {} v{}, {} dimensions, {} files, manifest {}", m.model_id, m.version, m.dimensions, m.files.len(), hex::encode(verified.manifest_hash));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--for-image`: a policy file's PCR0, or 96 hex digits. The publisher names its own image
/// here; the policy's signature is checked by whoever trusts it, not by this label.
fn image_pcr0(given: &str) -> anyhow::Result<[u8; 48]> {
    let path = std::path::Path::new(given);
    let pcr0 = if path.is_file() {
        let text = std::fs::read_to_string(path).with_context(|| format!("--for-image {given}"))?;
        let signed = protocol::attestation::SignedPolicy::from_json(&text).with_context(|| format!("--for-image {given}: not a policy file"))?;
        signed.policy.pcrs.get(&0).cloned().ok_or_else(|| anyhow!("--for-image {given}: the policy names no PCR0"))?
    } else {
        hex::decode(given.trim()).map_err(|_| anyhow!("--for-image {given:?}: neither a policy file nor a PCR0 in hex"))?
    };
    pcr0.try_into().map_err(|_| anyhow!("--for-image {given}: a PCR0 is 48 bytes"))
}
