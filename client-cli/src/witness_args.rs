//! `--witness KEY... --witness-quorum N` (or `EPHEM_WITNESSES`): the witnesses whose
//! cosignatures a checkpoint must carry. Its own module, beside `trust` and `ledger` which both
//! take it, so neither has to import the other.

use std::path::Path;

use anyhow::{anyhow, Context};
use clap::Args;
use receipts_ledger::{CosignerKey, WitnessPolicy};

#[derive(Args, Debug, Clone, Default)]
pub struct WitnessArgs {
    /// A witness's cosigner key (`name+hex8+base64(0x04 || key)`, or a file holding one or more,
    /// one a line); repeat for more. Default: `EPHEM_WITNESSES`, a comma- or newline-separated
    /// list of keys or files (`KEY@URL` entries, as the appender takes them, give their key).
    #[arg(long = "witness", value_name = "FILE|KEY")]
    pub witnesses: Vec<String>,
    /// How many of the witnesses must have cosigned the checkpoint (default: all given).
    #[arg(long = "witness-quorum", value_name = "N")]
    pub quorum: Option<usize>,
}

impl WitnessArgs {
    /// The policy, or `None` when no witness is asked for (no `--witness`, `EPHEM_WITNESSES`
    /// unset or empty).
    pub fn policy(&self) -> anyhow::Result<Option<WitnessPolicy>> {
        self.policy_with(std::env::var(receipts_ledger::witness_client::WITNESSES_ENV).ok().as_deref())
    }

    /// [`policy`](Self::policy) with `env` as the value of `EPHEM_WITNESSES`: the `--witness`
    /// keys when any are given, else the variable's.
    pub fn policy_with(&self, env: Option<&str>) -> anyhow::Result<Option<WitnessPolicy>> {
        let given: Vec<String> = if self.witnesses.is_empty() { list_entries(env.unwrap_or_default()) } else { self.witnesses.clone() };
        if given.is_empty() {
            if self.quorum.is_some_and(|q| q > 0) {
                return Err(anyhow!("--witness-quorum needs --witness keys (or EPHEM_WITNESSES)"));
            }
            return Ok(None);
        }
        let mut keys = Vec::new();
        for w in &given {
            let texts = if Path::new(w).is_file() {
                let text = std::fs::read_to_string(w).with_context(|| format!("reading witness keys {w}"))?;
                list_entries(&text)
            } else {
                vec![w.clone()]
            };
            if texts.is_empty() {
                return Err(anyhow!("witness key file {w} holds no key"));
            }
            for text in texts {
                keys.push(CosignerKey::parse(key_of(&text)).with_context(|| format!("witness key {w:?}"))?);
            }
        }
        let all = WitnessPolicy::new(keys, 0)?; // duplicates dropped
        let quorum = self.quorum.unwrap_or(all.keys.len());
        Ok(Some(WitnessPolicy::new(all.keys, quorum)?))
    }
}

/// The entries of a comma- or newline-separated list (blank ones skipped).
fn list_entries(text: &str) -> Vec<String> {
    text.split([',', '\n']).map(str::trim).filter(|e| !e.is_empty()).map(str::to_owned).collect()
}

/// A key, or the key of an appender's `KEY@http://HOST:PORT[/PREFIX]` entry.
fn key_of(entry: &str) -> &str {
    match entry.rsplit_once('@') {
        Some((key, url)) if url.starts_with("http://") || url.starts_with("https://") => key.trim(),
        _ => entry.trim(),
    }
}

