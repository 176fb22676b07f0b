#![forbid(unsafe_code)]
//! `fleet-rotate`: starts a new fleet-key epoch (`lambdas::fleet_rotate`) on its schedule or
//! when invoked (`FleetRotateFunctionName`). Each epoch is valid for twice the rotation
//! period, so jobs sealed to the previous epoch still open until the next rotation.
//!
//! Environment: `EPHEM_FLEET_KEY_ARN`, `EPHEM_ATTESTATIONS_BUCKET`, `EPHEM_ROTATION_DAYS`.

use lambdas::fleet_rotate;
use lambdas::shell::{self, ShellError};
use serde_json::{json, Value};

const DAY_MS: u64 = 24 * 3600 * 1000;

struct App {
    services: cloud::Services,
    validity_ms: u64,
}

fn init() -> Result<App, ShellError> {
    shell::var("EPHEM_FLEET_KEY_ARN")?;
    shell::var("EPHEM_ATTESTATIONS_BUCKET")?;
    let days: u64 = shell::var("EPHEM_ROTATION_DAYS")?
        .parse()
        .ok()
        .filter(|d| *d > 0)
        .ok_or_else(|| ShellError::Invalid { name: "EPHEM_ROTATION_DAYS", message: "not a positive number of days".into() })?;
    Ok(App { services: shell::services(&shell::aws()?), validity_ms: 2 * days * DAY_MS })
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    shell::init_logging();
    // The schedule's event and a manual invocation carry nothing the rotation needs.
    shell::serve("EphemBatch.FleetRotateError", init, |app: &App, _event: Value| {
        let record = fleet_rotate::rotate(&app.services, app.validity_ms, cloud::now_ms())?;
        Ok::<_, fleet_rotate::RotateError>(json!({"epoch": record.epoch, "not_after_ms": record.not_after_ms}))
    })
    .await
}
