//! Which cloud the client talks to. The embedded default is the local cloud under
//! `$EPHEM_HOME`, with the `on-upload` handler wired to the jobs store the way an S3 bucket
//! notification wires it to the Lambda.

use std::sync::Arc;

use anyhow::Context;
use cloud::local::LocalCloud;
use cloud::{layout, Services};

use crate::home::Home;

/// Opens the local cloud and subscribes `on-upload` to `jobs/…/input.sealed`.
pub fn open_local(home: &Home) -> anyhow::Result<(Services, LocalCloud)> {
    let local = LocalCloud::open(home.root()).with_context(|| format!("opening the local cloud in {}", home.root().display()))?;
    let services = local.services();
    let for_handler = services.clone();
    local.jobs_store().set_created_hook(
        layout::JOBS_PREFIX,
        layout::INPUT_SUFFIX,
        Arc::new(move |meta: &cloud::ObjectMeta| {
            let event = lambdas::on_upload::object_created_event("jobs", &meta.key, meta.size, &meta.etag);
            lambdas::on_upload::handle(&event, &for_handler).map(drop).map_err(|e| e.to_string())
        }),
    );
    Ok((services, local))
}
