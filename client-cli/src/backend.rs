//! Which cloud the client talks to (`--backend`).
//!
//! * `local` (the embedded default): the local cloud under `$EPHEM_HOME`, with the `on-upload`
//!   handler wired to the jobs store the way an S3 bucket notification wires it to the Lambda
//!   (job inputs, and sealed shards under `stores/`). The wiring is the embedded default's
//!   (`devstack::upload_wiring`), installed once by the binary ([`install_local_wiring`]).
//! * `aws`: S3, SQS and KMS, named by the `cdk deploy --outputs-file` JSON (`--stack-outputs`)
//!   or `EPHEM_*` variables, reached through the standard AWS credential, region and endpoint
//!   settings. Nothing runs in-process on upload: the bucket notification and the Lambdas do
//!   it (against an emulator, `ephem-batch dev aws-pump` stands in for them).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use anyhow::Context;
use clap::{Args, ValueEnum};
use cloud_aws::{AwsCloud, AwsSettings};
use cloud_local::LocalCloud;
use cloud::Services;
use protocol::kms_arn::KmsKeyArn;

use crate::home::Home;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// Everything on this machine, under --home (the embedded default).
    #[default]
    Local,
    /// S3, SQS and KMS of a deployment (or an emulator: AWS_ENDPOINT_URL).
    Aws,
}

/// The global flags that choose the backend.
#[derive(Args, Debug, Clone, Default)]
pub struct BackendArgs {
    /// Where the queues, objects and keys are.
    #[arg(long, global = true, env = "EPHEM_BACKEND", value_enum, default_value_t = Backend::Local)]
    pub backend: Backend,
    /// With --backend aws: the JSON file `cdk deploy --outputs-file` wrote (buckets, queues,
    /// keys, region). Single names can be given as EPHEM_* variables instead.
    #[arg(long, global = true, env = "EPHEM_STACK_OUTPUTS", value_name = "FILE")]
    pub stack_outputs: Option<PathBuf>,
    /// With --backend aws: `aws` (default), or `local` / `local:DIR` for the local KMS under
    /// --home / DIR — for AWS emulators, whose KMS cannot answer Recipient requests.
    #[arg(long, global = true, env = "EPHEM_KMS", value_name = "aws|local[:DIR]")]
    pub kms: Option<String>,
}

impl BackendArgs {
    /// The KMS setting with `local` resolved to the home, and paths made absolute (child
    /// processes get them as they are).
    pub fn kms_setting(&self, home: &Home) -> anyhow::Result<Option<String>> {
        Ok(match self.kms.as_deref() {
            Some("local") => Some(format!("local:{}", home.root().display())),
            Some(text) => match text.strip_prefix("local:") {
                Some(dir) => Some(format!("local:{}", std::path::absolute(dir).with_context(|| format!("--kms {text}"))?.display())),
                None => Some(text.to_owned()),
            },
            None => None,
        })
    }

    pub fn stack_outputs_absolute(&self) -> anyhow::Result<Option<PathBuf>> {
        self.stack_outputs
            .as_deref()
            .map(|p| std::path::absolute(p).with_context(|| format!("--stack-outputs {}", p.display())))
            .transpose()
    }

    /// The AWS settings these flags and the environment give.
    pub fn aws_settings(&self, home: &Home) -> anyhow::Result<AwsSettings> {
        let kms = self.kms_setting(home)?;
        Ok(AwsSettings::resolve(self.stack_outputs.as_deref(), kms.as_deref())?)
    }
}

/// The opened backend: the services every command uses, and the backend's own handle.
pub struct Opened {
    pub services: Services,
    pub local: Option<LocalCloud>,
    pub aws: Option<AwsCloud>,
}

/// Opens the backend the flags name.
pub fn open(home: &Home, args: &BackendArgs) -> anyhow::Result<Opened> {
    let opened = open_services(home, args)?;
    let _ = FLEET_KMS_KEY.set(resolve_fleet_kms_key(&opened.services));
    Ok(opened)
}

/// The deployment's fleet KMS key as the opened backend names it: the stack outputs' ARN, or
/// the key behind the configured name (the local fleet alias), resolved through the client's
/// own KMS connection — never through a host.
fn resolve_fleet_kms_key(services: &Services) -> Option<KmsKeyArn> {
    let name = &services.keys.fleet;
    name.parse().ok().or_else(|| services.kms.describe_key(name).ok().and_then(|d| d.arn.parse().ok()))
}

/// One backend per process, so one fleet KMS key: set by [`open`].
static FLEET_KMS_KEY: OnceLock<Option<KmsKeyArn>> = OnceLock::new();

/// The fleet KMS key of the backend [`open`] opened, if it names one.
pub fn fleet_kms_key() -> Option<KmsKeyArn> {
    FLEET_KMS_KEY.get().cloned().flatten()
}

fn open_services(home: &Home, args: &BackendArgs) -> anyhow::Result<Opened> {
    match args.backend {
        Backend::Local => {
            let (services, local) = open_local(home)?;
            Ok(Opened { services, local: Some(local), aws: None })
        }
        Backend::Aws => {
            let settings = args.aws_settings(home)?;
            let aws = AwsCloud::connect(&settings, Some(cloud_local::open_emulator_kms)).context("connecting to AWS")?;
            let source = match &settings.ledger_bucket {
                Some(bucket) => LedgerSource::Bucket {
                    name: bucket.clone(),
                    objects: Arc::new(aws.clients().object_store(bucket, "")),
                    copy: aws_ledger_copy(home),
                },
                None => LedgerSource::Unnamed,
            };
            let _ = LEDGER.set(source);
            Ok(Opened { services: aws.services(), local: None, aws: Some(aws) })
        }
    }
}

/// Where `verify` finds the ledger of the backend this process opened.
pub enum LedgerSource {
    /// The home's own ledger (the embedded default).
    Home,
    /// A deployment's ledger on S3 (tlog-tiles), read through a synced copy in `copy`.
    Bucket { name: String, objects: Arc<dyn cloud::ObjectStore>, copy: PathBuf },
    /// `--backend aws` without a ledger bucket in the settings.
    Unnamed,
}

/// One backend per process (the global `--backend`), so one ledger: set by [`open`].
static LEDGER: OnceLock<LedgerSource> = OnceLock::new();

/// The ledger of the backend [`open`] opened (the home's when nothing else was opened).
pub fn ledger_source() -> &'static LedgerSource {
    LEDGER.get_or_init(|| LedgerSource::Home)
}

/// With `--backend aws`, the home's copy of the deployment's ledger (`ledger sync` fills it,
/// `verify` brings it up to date), apart from the home's own ledger, whose key differs.
pub fn aws_ledger_copy(home: &Home) -> PathBuf {
    home.root().join("aws-ledger")
}

/// The ledger directory the `ledger` commands read with these flags.
pub fn ledger_dir(home: &Home, args: &BackendArgs) -> PathBuf {
    match args.backend {
        Backend::Local => home.ledger_dir(),
        Backend::Aws => aws_ledger_copy(home),
    }
}

/// What runs in-process when the local jobs store receives an object (`on-upload`, in the
/// embedded default): composed once, by the binary, like a crypto provider.
pub type LocalWiring = fn(&Services, &LocalCloud);

static LOCAL_WIRING: OnceLock<LocalWiring> = OnceLock::new();

/// Installs the local backend's upload wiring; the first installation wins.
pub fn install_local_wiring(wiring: LocalWiring) {
    let _ = LOCAL_WIRING.set(wiring);
}

/// Opens the local cloud with the installed upload wiring. Without one, nothing would ever pick
/// up a submitted job, so opening is refused rather than leaving jobs to wait forever.
pub fn open_local(home: &Home) -> anyhow::Result<(Services, LocalCloud)> {
    let wiring = LOCAL_WIRING.get().context("the local backend has no upload wiring installed (the ephem-batch binary installs the embedded default's)")?;
    let local = LocalCloud::open(home.root()).with_context(|| format!("opening the local cloud in {}", home.root().display()))?;
    let services = local.services();
    wiring(&services, &local);
    Ok((services, local))
}
