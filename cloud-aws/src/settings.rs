//! Where the adapters find the deployment, the AWS way:
//!
//! * **the connection** comes from the SDK's standard chains — credentials (environment,
//!   profile, web identity, ECS/EC2 instance roles), the region (`AWS_REGION`, profile), and
//!   endpoints (`AWS_ENDPOINT_URL`, or per service `AWS_ENDPOINT_URL_S3`, `_SQS`, `_KMS`) for
//!   an emulator. With an endpoint URL, S3 is addressed path-style (`http://host/bucket/key`),
//!   which emulators need;
//! * **the deployment's names** come from `EPHEM_*` environment variables (what a fleet host
//!   gets, docs/operations.md §6), else from the stack outputs file that
//!   `cdk deploy --outputs-file` writes (`EPHEM_STACK_OUTPUTS`, `--stack-outputs`), whose
//!   `Region` is used when `AWS_REGION` is not set;
//! * **KMS** is AWS KMS, or with `EPHEM_KMS=local:<dir>` the local KMS of the embedded default
//!   under `<dir>` — for emulators, which cannot do what `Recipient` needs (see the crate docs).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const ENV_STACK_OUTPUTS: &str = "EPHEM_STACK_OUTPUTS";
pub const ENV_STACK_NAME: &str = "EPHEM_STACK_NAME";
pub const ENV_KMS: &str = "EPHEM_KMS";
/// The CDK app's default stack name.
pub const DEFAULT_STACK_NAME: &str = "EphemBatch";
/// The stack output an emulator bootstrap adds: the queue S3 sends upload events to (in AWS
/// the events go straight to the `on-upload` Lambda).
pub const UPLOAD_EVENTS_OUTPUT: &str = "UploadEventsQueueUrl";

/// One name of the deployment: its stack output and its environment variable.
#[derive(Debug, Clone, Copy)]
pub struct Name {
    pub output: &'static str,
    pub env: &'static str,
}

pub const REGION: Name = Name { output: "Region", env: "AWS_REGION" };
pub const JOBS_BUCKET: Name = Name { output: "JobsBucketName", env: "EPHEM_JOBS_BUCKET" };
pub const MODELS_BUCKET: Name = Name { output: "ModelsBucketName", env: "EPHEM_MODELS_BUCKET" };
pub const ATTESTATIONS_BUCKET: Name = Name { output: "AttestationsBucketName", env: "EPHEM_ATTESTATIONS_BUCKET" };
pub const LEDGER_BUCKET: Name = Name { output: "LedgerBucketName", env: "EPHEM_LEDGER_BUCKET" };
pub const JOB_QUEUE: Name = Name { output: "JobQueueUrl", env: "EPHEM_JOB_QUEUE_URL" };
pub const JOB_DLQ: Name = Name { output: "JobDlqUrl", env: "EPHEM_JOB_DLQ_URL" };
pub const LEDGER_QUEUE: Name = Name { output: "LedgerQueueUrl", env: "EPHEM_LEDGER_QUEUE_URL" };
pub const LEDGER_DLQ: Name = Name { output: "LedgerDlqUrl", env: "EPHEM_LEDGER_DLQ_URL" };
pub const UPLOAD_EVENTS_QUEUE: Name = Name { output: UPLOAD_EVENTS_OUTPUT, env: "EPHEM_UPLOAD_EVENTS_QUEUE_URL" };
pub const FLEET_KEY: Name = Name { output: "FleetKeyArn", env: "EPHEM_FLEET_KEY_ARN" };
pub const MODEL_KEY: Name = Name { output: "ModelKeyArn", env: "EPHEM_MODEL_KEY_ARN" };
pub const BULK_STATE_MACHINE: Name = Name { output: "BulkStateMachineArn", env: "EPHEM_BULK_STATE_MACHINE_ARN" };
pub const STORE_PREFIXES: Name = Name { output: "StorePrefixes", env: "EPHEM_STORE_PREFIXES" };
pub const LEDGER_SIGNING_KEY: Name = Name { output: "LedgerSigningKeyArn", env: "EPHEM_LEDGER_KEY_ARN" };

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("stack outputs {path}: {message}")]
    Outputs { path: PathBuf, message: String },
    #[error("the AWS backend needs {}; set them or pass the stack outputs file (--stack-outputs / EPHEM_STACK_OUTPUTS)", .0.join(", "))]
    Missing(Vec<String>),
    #[error("the KMS setting (--kms / EPHEM_KMS) is `aws` or `local:<directory>`, not {0:?}")]
    Kms(String),
}

/// Which KMS answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum KmsBackend {
    #[default]
    Aws,
    /// The local KMS under this directory (`kms.sqlite`, trusting `enclave/dev-root.pem`).
    Local(PathBuf),
}

impl std::str::FromStr for KmsBackend {
    type Err = SettingsError;

    fn from_str(text: &str) -> Result<KmsBackend, SettingsError> {
        match text.split_once(':') {
            None if text == "aws" => Ok(KmsBackend::Aws),
            Some(("local", dir)) if !dir.is_empty() => Ok(KmsBackend::Local(PathBuf::from(dir))),
            _ => Err(SettingsError::Kms(text.to_owned())),
        }
    }
}

/// Everything the AWS backend needs to know.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AwsSettings {
    /// Overrides the SDK's region chain.
    pub region: Option<String>,
    /// Overrides `AWS_ENDPOINT_URL` (every service).
    pub endpoint_url: Option<String>,
    pub jobs_bucket: String,
    pub models_bucket: String,
    pub attestations_bucket: String,
    pub ledger_bucket: Option<String>,
    pub job_queue_url: String,
    pub job_dlq_url: Option<String>,
    pub ledger_queue_url: String,
    pub ledger_dlq_url: Option<String>,
    /// Emulators only: where S3 sends `jobs/…/input.sealed` events.
    pub upload_events_queue_url: Option<String>,
    pub fleet_key: Option<String>,
    pub model_key: Option<String>,
    /// The bulk workflow (`submit --bulk`); hosts complete its task tokens without it.
    pub bulk_state_machine_arn: Option<String>,
    /// Where sealed shards become jobs (comma-separated, as the stack outputs them).
    pub store_prefixes: Option<String>,
    /// The KMS key that signs the ledger's checkpoints (none in an emulator: no Ed25519 keys).
    pub ledger_signing_key_arn: Option<String>,
    pub kms: KmsBackend,
}

impl AwsSettings {
    /// From the process environment (a fleet host).
    pub fn from_env() -> Result<AwsSettings, SettingsError> {
        AwsSettings::resolve(None, None)
    }

    /// `stack_outputs` and `kms` are the command line's; each falls back to its variable.
    pub fn resolve(stack_outputs: Option<&Path>, kms: Option<&str>) -> Result<AwsSettings, SettingsError> {
        AwsSettings::resolve_with(stack_outputs, kms, |name| std::env::var(name).ok())
    }

    /// As [`resolve`](Self::resolve), reading variables through `env`.
    pub fn resolve_with(
        stack_outputs: Option<&Path>,
        kms: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<AwsSettings, SettingsError> {
        let env = |name: &str| env(name).filter(|v| !v.is_empty());
        let outputs_path = stack_outputs.map(Path::to_path_buf).or_else(|| env(ENV_STACK_OUTPUTS).map(PathBuf::from));
        let outputs = match &outputs_path {
            Some(path) => StackOutputs::load(path, env(ENV_STACK_NAME).as_deref())?.values,
            None => BTreeMap::new(),
        };
        let value = |name: Name| env(name.env).or_else(|| outputs.get(name.output).cloned());
        let mut missing = Vec::new();
        let mut required = |name: Name| {
            value(name).unwrap_or_else(|| {
                missing.push(format!("{} ({})", name.env, name.output));
                String::new()
            })
        };
        let jobs_bucket = required(JOBS_BUCKET);
        let models_bucket = required(MODELS_BUCKET);
        let attestations_bucket = required(ATTESTATIONS_BUCKET);
        let job_queue_url = required(JOB_QUEUE);
        let ledger_queue_url = required(LEDGER_QUEUE);
        if !missing.is_empty() {
            return Err(SettingsError::Missing(missing));
        }
        let kms = match kms.map(str::to_owned).or_else(|| env(ENV_KMS)) {
            Some(text) => text.parse()?,
            None => KmsBackend::Aws,
        };
        Ok(AwsSettings {
            // The variable wins through the SDK's own chain; the outputs only fill in.
            region: if env("AWS_REGION").is_some() || env("AWS_DEFAULT_REGION").is_some() {
                None
            } else {
                outputs.get(REGION.output).cloned()
            },
            endpoint_url: None,
            jobs_bucket,
            models_bucket,
            attestations_bucket,
            ledger_bucket: value(LEDGER_BUCKET),
            job_queue_url,
            job_dlq_url: value(JOB_DLQ),
            ledger_queue_url,
            ledger_dlq_url: value(LEDGER_DLQ),
            upload_events_queue_url: value(UPLOAD_EVENTS_QUEUE),
            fleet_key: value(FLEET_KEY),
            model_key: value(MODEL_KEY),
            bulk_state_machine_arn: value(BULK_STATE_MACHINE),
            store_prefixes: value(STORE_PREFIXES),
            ledger_signing_key_arn: value(LEDGER_SIGNING_KEY),
            kms,
        })
    }
}

/// The file `cdk deploy --outputs-file` writes: `{"<stack>": {"<output>": "<value>", …}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StackOutputs {
    pub stack: String,
    pub values: BTreeMap<String, String>,
}

impl StackOutputs {
    /// Reads one stack's outputs: `stack` (or `EPHEM_STACK_NAME`), else the file's only stack,
    /// else the default stack name.
    pub fn load(path: &Path, stack: Option<&str>) -> Result<StackOutputs, SettingsError> {
        let fail = |message: String| SettingsError::Outputs { path: path.to_path_buf(), message };
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        let stacks: BTreeMap<String, BTreeMap<String, serde_json::Value>> =
            serde_json::from_str(&text).map_err(|e| fail(format!("not a `cdk deploy --outputs-file` file: {e}")))?;
        let name = match stack {
            Some(name) => name.to_owned(),
            None if stacks.len() == 1 => stacks.keys().next().cloned().unwrap_or_default(),
            None => DEFAULT_STACK_NAME.to_owned(),
        };
        let outputs = stacks.get(&name).ok_or_else(|| {
            fail(format!("no stack {name:?} (stacks: {}; set EPHEM_STACK_NAME)", stacks.keys().cloned().collect::<Vec<_>>().join(", ")))
        })?;
        let values = outputs
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string())))
            .collect();
        Ok(StackOutputs { stack: name, values })
    }

    /// Writes the file in the same shape.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let file = serde_json::json!({ &self.stack: self.values });
        std::fs::write(path, serde_json::to_string_pretty(&file).expect("outputs serialise") + "\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| map.get(name).cloned()
    }

    fn outputs_file(dir: &Path, json: serde_json::Value) -> PathBuf {
        let path = dir.join("outputs.json");
        std::fs::write(&path, json.to_string()).unwrap();
        path
    }

    #[test]
    fn names_come_from_the_outputs_file_and_the_environment_wins() {
        let dir = tempfile::tempdir().unwrap();
        let path = outputs_file(
            dir.path(),
            serde_json::json!({"EphemBatch": {
                "Region": "eu-west-1", "JobsBucketName": "jobs-b", "ModelsBucketName": "models-b",
                "AttestationsBucketName": "att-b", "JobQueueUrl": "https://sqs/q", "LedgerQueueUrl": "https://sqs/l.fifo",
                "FleetKeyArn": "arn:fleet", "ModelKeyArn": "arn:model", "JobDlqUrl": "https://sqs/dlq", "ImageSha384": "ab",
                "BulkStateMachineArn": "arn:aws:states:eu-west-1:1:stateMachine:bulk", "StorePrefixes": "stores/"
            }}),
        );
        let settings = AwsSettings::resolve_with(Some(&path), None, env_of(&[("EPHEM_JOBS_BUCKET", "override")])).unwrap();
        assert_eq!(settings.jobs_bucket, "override");
        assert_eq!(settings.models_bucket, "models-b");
        assert_eq!(settings.region.as_deref(), Some("eu-west-1"));
        assert_eq!(settings.fleet_key.as_deref(), Some("arn:fleet"));
        assert_eq!(settings.job_dlq_url.as_deref(), Some("https://sqs/dlq"));
        assert_eq!(settings.ledger_dlq_url, None);
        assert_eq!(settings.kms, KmsBackend::Aws);
        assert_eq!(settings.bulk_state_machine_arn.as_deref(), Some("arn:aws:states:eu-west-1:1:stateMachine:bulk"));
        assert_eq!(settings.store_prefixes.as_deref(), Some("stores/"));

        // AWS_REGION is the SDK's to read; the file does not override it.
        let with_region = AwsSettings::resolve_with(Some(&path), Some("local:/h"), env_of(&[("AWS_REGION", "us-east-2")])).unwrap();
        assert_eq!(with_region.region, None);
        assert_eq!(with_region.kms, KmsBackend::Local("/h".into()));

        // The file named by the variable, the stack named by its variable.
        let two = outputs_file(dir.path(), serde_json::json!({"A": {}, "B": {"JobsBucketName": "b"}}));
        let err = AwsSettings::resolve_with(None, None, env_of(&[("EPHEM_STACK_OUTPUTS", two.to_str().unwrap())])).unwrap_err();
        assert!(err.to_string().contains("no stack \"EphemBatch\""), "{err}");
        let err = AwsSettings::resolve_with(
            None,
            None,
            env_of(&[("EPHEM_STACK_OUTPUTS", two.to_str().unwrap()), ("EPHEM_STACK_NAME", "B")]),
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("EPHEM_MODELS_BUCKET (ModelsBucketName)") && !text.contains("EPHEM_JOBS_BUCKET"), "{text}");
    }

    #[test]
    fn environment_alone_is_enough_for_a_host() {
        let env = env_of(&[
            ("EPHEM_JOBS_BUCKET", "j"),
            ("EPHEM_MODELS_BUCKET", "m"),
            ("EPHEM_ATTESTATIONS_BUCKET", "a"),
            ("EPHEM_JOB_QUEUE_URL", "https://q"),
            ("EPHEM_LEDGER_QUEUE_URL", "https://l.fifo"),
            ("EPHEM_KMS", "aws"),
        ]);
        let settings = AwsSettings::resolve_with(None, None, env).unwrap();
        assert_eq!(settings.attestations_bucket, "a");
        assert_eq!(settings.fleet_key, None);
        assert_eq!(settings.bulk_state_machine_arn, None);
        for bad in ["", "local", "local:", "kms"] {
            assert!(bad.parse::<KmsBackend>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn outputs_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let outputs = StackOutputs { stack: "S".into(), values: [("JobsBucketName".to_owned(), "j".to_owned())].into() };
        let path = dir.path().join("o.json");
        outputs.write(&path).unwrap();
        assert_eq!(StackOutputs::load(&path, None).unwrap(), outputs);
        assert!(StackOutputs::load(&dir.path().join("missing.json"), None).is_err());
    }
}
