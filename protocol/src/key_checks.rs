//! Is a KMS key one that releases only to the measured image and wraps nothing anyone chose?
//! (docs/protocol.md §7.3.2)
//!
//! The enclave runs these checks on what KMS itself says about the key — `DescribeKey`,
//! `GetKeyPolicy` and `ListGrants`, read inside the enclave's own TLS session to KMS — before it
//! asks KMS to generate a fleet key pair under it, and binds the digest of that
//! [`KeyEvidence`] into the epoch's genesis document (`attestation::genesis`). A client re-runs
//! them on the evidence the epoch record carries, with no AWS credentials; `ephem-batch fleet
//! check-key` runs them on what its own credentials read.
//!
//! What must hold, and why each matters to a key whose generated pairs only enclaves may know:
//! * `key_arn`: the evidence is about the key asked for.
//! * `key_state`, `key_origin`, `key_spec`, `key_multi_region`: enabled; material made by KMS
//!   (`AWS_KMS`: nobody imported material they know); a symmetric encryption key; not
//!   multi-Region (a replica carries the same material under a policy of its own).
//! * `key_grants`: no grant at all. Grants outlive `PutKeyPolicy`: one made before the policy
//!   was tightened could still let its grantee `Encrypt` or `Decrypt`.
//! * `key_policy_document`: the policy parses, has no duplicate key anywhere (IAM and this
//!   reader might disagree on which one wins), and allows nothing through `NotAction` or
//!   `NotPrincipal`.
//! * `key_policy_no_wrapping`: no statement allows an operation that wraps chosen material or
//!   changes the key's rules.
//! * `key_policy_denies_wrapping`: an explicit, unconditional Deny for every principal of
//!   `Encrypt`, `ReEncrypt*`, `CreateGrant`, `PutKeyPolicy` and `Import*`, so the rules can never
//!   be loosened by anyone the account later trusts.
//! * `key_policy_attested_release`: every allowed release (`Decrypt`, `GenerateDataKey`,
//!   `GenerateDataKeyPair`) requires the image's PCR0.
//! * `key_policy_denies_unattested_release`: explicit Denies for every principal of each release
//!   without the PCR0 condition (`Null`) and with another value (`StringNotEquals*`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::kms_arn::KmsKeyArn;

mod strict_json;

/// Operations that put material someone chose under the key, or change who may use it.
pub const FORBIDDEN_ACTIONS: [&str; 7] = [
    "kms:Encrypt",
    "kms:ReEncryptFrom",
    "kms:ReEncryptTo",
    "kms:ImportKeyMaterial",
    "kms:PutKeyPolicy",
    "kms:CreateGrant",
    "kms:ReplicateKey",
];

/// Operations that return plaintext: allowed only to an attested enclave (with `Recipient`).
pub const RELEASE_ACTIONS: [&str; 3] = ["kms:Decrypt", "kms:GenerateDataKey", "kms:GenerateDataKeyPair"];

/// The condition keys KMS sets from a `Recipient` document's PCR0 (lowercase: IAM keys are
/// case-insensitive).
const PCR0_CONDITION_KEYS: [&str; 2] = ["kms:recipientattestation:imagesha384", "kms:recipientattestation:pcr0"];

/// Domain separation of the evidence digest.
const EVIDENCE_LABEL: &[u8] = b"ephem-batch/key-evidence/1\0";

/// What KMS says about a key: the parts of `DescribeKey`, `GetKeyPolicy` and `ListGrants` the
/// checks read. Serialised as JSON in the epoch record; its digest is bound into the genesis
/// document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEvidence {
    pub metadata: KeyMetadata,
    /// The key policy exactly as `GetKeyPolicy` returned it (a JSON document in a string).
    pub policy: String,
    pub grants: Vec<GrantSummary>,
    /// `ListGrants` said there were more than it returned.
    pub grants_truncated: bool,
}

/// `DescribeKey`'s `KeyMetadata`, the fields the checks read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyMetadata {
    pub arn: String,
    pub key_state: String,
    pub enabled: bool,
    pub origin: String,
    pub key_spec: String,
    pub key_usage: String,
    pub multi_region: bool,
}

/// One grant of `ListGrants`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantSummary {
    pub grant_id: String,
    pub grantee_principal: String,
    pub operations: Vec<String>,
}

impl KeyEvidence {
    /// SHA-256 over a label and the evidence's JSON (fields in declaration order).
    pub fn digest(&self) -> [u8; 32] {
        let json = serde_json::to_vec(self).unwrap_or_default();
        Sha256::new().chain_update(EVIDENCE_LABEL).chain_update(&json).finalize().into()
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The checks, in the order they run. Every one is evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyCheck {
    KeyArn,
    KeyState,
    KeyOrigin,
    KeySpec,
    KeyMultiRegion,
    KeyGrants,
    KeyPolicyDocument,
    KeyPolicyNoWrapping,
    KeyPolicyDeniesWrapping,
    KeyPolicyAttestedRelease,
    KeyPolicyDeniesUnattestedRelease,
}

impl KeyCheck {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyCheck::KeyArn => "key_arn",
            KeyCheck::KeyState => "key_state",
            KeyCheck::KeyOrigin => "key_origin",
            KeyCheck::KeySpec => "key_spec",
            KeyCheck::KeyMultiRegion => "key_multi_region",
            KeyCheck::KeyGrants => "key_grants",
            KeyCheck::KeyPolicyDocument => "key_policy_document",
            KeyCheck::KeyPolicyNoWrapping => "key_policy_no_wrapping",
            KeyCheck::KeyPolicyDeniesWrapping => "key_policy_denies_wrapping",
            KeyCheck::KeyPolicyAttestedRelease => "key_policy_attested_release",
            KeyCheck::KeyPolicyDeniesUnattestedRelease => "key_policy_denies_unattested_release",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckOutcome {
    pub name: KeyCheck,
    pub passed: bool,
    pub detail: String,
}

/// Every check's outcome for one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyReport {
    pub key: String,
    pub checks: Vec<CheckOutcome>,
}

impl KeyReport {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }

    pub fn failed(&self) -> Vec<KeyCheck> {
        self.checks.iter().filter(|c| !c.passed).map(|c| c.name).collect()
    }

    /// `name: detail; name: detail` of the failed checks.
    pub fn failures(&self) -> String {
        let failed: Vec<String> =
            self.checks.iter().filter(|c| !c.passed).map(|c| format!("{}: {}", c.name.as_str(), c.detail)).collect();
        failed.join("; ")
    }
}

/// Runs every check on `evidence` for the key `expected`, whose release must require `pcr0`.
pub fn evaluate(evidence: &KeyEvidence, expected: &KmsKeyArn, pcr0: &[u8]) -> KeyReport {
    let mut checks = Vec::new();
    let mut record = |name, result: Result<String, String>| {
        let (passed, detail) = match result {
            Ok(detail) => (true, detail),
            Err(detail) => (false, detail),
        };
        checks.push(CheckOutcome { name, passed, detail });
    };
    let is = |ok: bool, good: String, bad: String| if ok { Ok(good) } else { Err(bad) };
    let m = &evidence.metadata;
    record(KeyCheck::KeyArn, is(m.arn == expected.as_str(), format!("{} is the key asked for", m.arn), format!("described {}, asked {expected}", m.arn)));
    record(
        KeyCheck::KeyState,
        is(m.enabled && m.key_state == "Enabled", "Enabled".into(), format!("state {:?}, enabled {}", m.key_state, m.enabled)),
    );
    record(
        KeyCheck::KeyOrigin,
        is(m.origin == "AWS_KMS", "AWS_KMS: KMS made the material".into(), format!("origin {:?}: material may be known outside KMS", m.origin)),
    );
    let spec_ok = m.key_spec == "SYMMETRIC_DEFAULT" && m.key_usage == "ENCRYPT_DECRYPT";
    record(KeyCheck::KeySpec, is(spec_ok, "SYMMETRIC_DEFAULT, ENCRYPT_DECRYPT".into(), format!("{} / {}", m.key_spec, m.key_usage)));
    record(
        KeyCheck::KeyMultiRegion,
        is(!m.multi_region, "single-Region".into(), "multi-Region: replicas share the material under their own policies".into()),
    );
    let grants = if evidence.grants_truncated {
        Err("ListGrants was truncated: there are grants".to_owned())
    } else if let Some(grant) = evidence.grants.first() {
        Err(format!(
            "{} grant(s), e.g. {} lets {} {}",
            evidence.grants.len(),
            grant.grant_id,
            grant.grantee_principal,
            grant.operations.join(", ")
        ))
    } else {
        Ok("no grants".to_owned())
    };
    record(KeyCheck::KeyGrants, grants);
    let pcr0 = hex::encode(pcr0);
    let policy_checks = [
        KeyCheck::KeyPolicyNoWrapping,
        KeyCheck::KeyPolicyDeniesWrapping,
        KeyCheck::KeyPolicyAttestedRelease,
        KeyCheck::KeyPolicyDeniesUnattestedRelease,
    ];
    match Statements::parse(&evidence.policy) {
        Err(error) => {
            record(KeyCheck::KeyPolicyDocument, Err(error));
            for check in policy_checks {
                record(check, Err("not evaluated: the policy does not parse".into()));
            }
        }
        Ok(statements) => {
            record(KeyCheck::KeyPolicyDocument, Ok(format!("{} statements", statements.0.len())));
            record(KeyCheck::KeyPolicyNoWrapping, statements.no_wrapping());
            record(KeyCheck::KeyPolicyDeniesWrapping, statements.denies_wrapping());
            record(KeyCheck::KeyPolicyAttestedRelease, statements.attested_release(&pcr0));
            record(KeyCheck::KeyPolicyDeniesUnattestedRelease, statements.denies_unattested_release(&pcr0));
        }
    }
    KeyReport { key: m.arn.clone(), checks }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    Allow,
    Deny,
}

/// One statement, read: condition operator → lowercase key → values.
struct Statement {
    sid: String,
    effect: Effect,
    /// `Principal` is `"*"` or `{"AWS": "*"}`: everyone.
    everyone: bool,
    /// `NotAction`, `NotPrincipal` or `NotResource`: a Deny that exempts something.
    exempts: bool,
    actions: Vec<String>,
    conditions: BTreeMap<String, BTreeMap<String, Vec<String>>>,
}

struct Statements(Vec<Statement>);

impl Statements {
    fn parse(text: &str) -> Result<Statements, String> {
        let document = strict_json::parse(text).map_err(|e| format!("not a JSON policy document: {e}"))?;
        let statements = match &document["Statement"] {
            Value::Array(list) => list.clone(),
            one @ Value::Object(_) => vec![one.clone()],
            _ => return Err("no Statement".into()),
        };
        let mut out = Vec::new();
        for (i, statement) in statements.iter().enumerate() {
            let sid = statement["Sid"].as_str().map_or_else(|| format!("#{i}"), str::to_owned);
            let effect = match statement["Effect"].as_str() {
                Some("Deny") => Effect::Deny,
                Some("Allow") => Effect::Allow,
                other => return Err(format!("statement {sid}: Effect {other:?}")),
            };
            let exempts = ["NotAction", "NotPrincipal", "NotResource"].iter().any(|k| statement.get(*k).is_some());
            if effect == Effect::Allow && exempts {
                return Err(format!("statement {sid} allows with NotAction/NotPrincipal/NotResource: everything but a list"));
            }
            let actions = match statement.get("Action") {
                Some(action) => strings(action).ok_or_else(|| format!("statement {sid}: Action is not a string or list"))?,
                None => Vec::new(),
            };
            let everyone = match statement.get("Principal") {
                Some(Value::String(p)) => p == "*",
                Some(Value::Object(map)) => map.len() == 1 && map.get("AWS").and_then(strings).is_some_and(|p| p == ["*"]),
                _ => false,
            };
            let resource_all = match statement.get("Resource") {
                None => true,
                Some(resource) => strings(resource).is_some_and(|r| r.iter().any(|r| r == "*")),
            };
            let mut conditions = BTreeMap::new();
            if let Some(condition) = statement.get("Condition") {
                let map = condition.as_object().ok_or_else(|| format!("statement {sid}: Condition is not a map"))?;
                for (operator, keys) in map {
                    let keys = keys.as_object().ok_or_else(|| format!("statement {sid}: condition {operator} is not a map"))?;
                    let mut by_key = BTreeMap::new();
                    for (key, values) in keys {
                        let values = strings(values).ok_or_else(|| format!("statement {sid}: condition {operator} {key}"))?;
                        by_key.insert(key.to_ascii_lowercase(), values);
                    }
                    conditions.insert(operator.clone(), by_key);
                }
            }
            out.push(Statement { sid, effect, everyone, exempts: exempts || !resource_all, actions, conditions });
        }
        Ok(Statements(out))
    }

    fn allows(&self) -> impl Iterator<Item = &Statement> {
        self.0.iter().filter(|s| s.effect == Effect::Allow)
    }

    /// Deny statements for everyone that exempt nothing.
    fn denies_for_everyone(&self) -> impl Iterator<Item = &Statement> {
        self.0.iter().filter(|s| s.effect == Effect::Deny && s.everyone && !s.exempts)
    }

    fn no_wrapping(&self) -> Result<String, String> {
        let granted: Vec<String> = self
            .allows()
            .flat_map(|s| FORBIDDEN_ACTIONS.iter().filter(|a| s.covers(a)).map(move |a| format!("{} allows {a}", s.sid)))
            .collect();
        if granted.is_empty() { Ok(format!("nobody is allowed {}", FORBIDDEN_ACTIONS.join(", "))) } else { Err(granted.join("; ")) }
    }

    fn denies_wrapping(&self) -> Result<String, String> {
        let missing: Vec<&str> = FORBIDDEN_ACTIONS
            .iter()
            .copied()
            .filter(|a| *a != "kms:ReplicateKey")
            .filter(|a| !self.denies_for_everyone().any(|s| s.conditions.is_empty() && s.covers(a)))
            .collect();
        if missing.is_empty() {
            Ok("an unconditional Deny for everyone covers Encrypt, ReEncrypt*, CreateGrant, PutKeyPolicy, Import*".into())
        } else {
            Err(format!("no unconditional Deny for every principal of {}", missing.join(", ")))
        }
    }

    fn attested_release(&self, pcr0: &str) -> Result<String, String> {
        let mut attested = 0;
        for statement in self.allows() {
            let released: Vec<&str> = RELEASE_ACTIONS.iter().copied().filter(|a| statement.covers(a)).collect();
            if released.is_empty() {
                continue;
            }
            if !statement.requires_pcr0(pcr0) {
                return Err(format!("{} allows {} without requiring PCR0 = {pcr0}", statement.sid, released.join(", ")));
            }
            attested += 1;
        }
        if attested == 0 {
            return Err("no statement lets an attested enclave have a key".into());
        }
        Ok(format!("{attested} statement(s) release only to PCR0 {}…", &pcr0[..16.min(pcr0.len())]))
    }

    fn denies_unattested_release(&self, pcr0: &str) -> Result<String, String> {
        let mut missing = Vec::new();
        for action in RELEASE_ACTIONS {
            let covering: Vec<&Statement> = self.denies_for_everyone().filter(|s| s.covers(action)).collect();
            if !covering.iter().any(|s| s.only_condition_is_pcr0_absent()) {
                missing.push(format!("{action} without the PCR0 condition"));
            }
            if !covering.iter().any(|s| s.only_condition_is_pcr0_other_than(pcr0)) {
                missing.push(format!("{action} with another PCR0"));
            }
        }
        if missing.is_empty() {
            Ok("release is denied to everyone without this PCR0".into())
        } else {
            Err(format!("no Deny for every principal of {}", missing.join(", ")))
        }
    }
}

impl Statement {
    fn covers(&self, action: &str) -> bool {
        self.actions.iter().any(|pattern| glob(&pattern.to_ascii_lowercase(), &action.to_ascii_lowercase()))
    }

    /// A StringEquals(IgnoreCase) condition on a PCR0 key whose every value is `pcr0`.
    fn requires_pcr0(&self, pcr0: &str) -> bool {
        ["StringEquals", "StringEqualsIgnoreCase"].iter().any(|operator| {
            self.conditions.get(*operator).is_some_and(|keys| {
                PCR0_CONDITION_KEYS.iter().any(|key| {
                    keys.get(*key).is_some_and(|values| !values.is_empty() && values.iter().all(|v| v.eq_ignore_ascii_case(pcr0)))
                })
            })
        })
    }

    /// The only condition is `Null: {<PCR0 key>: "true"}`: applies whenever PCR0 is absent.
    fn only_condition_is_pcr0_absent(&self) -> bool {
        self.single_pcr0_condition(&["Null"]).is_some_and(|values| values == ["true"])
    }

    /// The only condition is `StringNotEquals[IgnoreCase]: {<PCR0 key>: pcr0}`.
    fn only_condition_is_pcr0_other_than(&self, pcr0: &str) -> bool {
        self.single_pcr0_condition(&["StringNotEquals", "StringNotEqualsIgnoreCase"])
            .is_some_and(|values| values.len() == 1 && values[0].eq_ignore_ascii_case(pcr0))
    }

    fn single_pcr0_condition(&self, operators: &[&str]) -> Option<&[String]> {
        let [(operator, keys)] = self.conditions.iter().collect::<Vec<_>>()[..] else { return None };
        let [(key, values)] = keys.iter().collect::<Vec<_>>()[..] else { return None };
        (operators.contains(&operator.as_str()) && PCR0_CONDITION_KEYS.contains(&key.as_str())).then_some(values.as_slice())
    }
}

fn strings(value: &Value) -> Option<Vec<String>> {
    match value {
        Value::String(s) => Some(vec![s.clone()]),
        Value::Array(list) => list.iter().map(|v| v.as_str().map(str::to_owned)).collect(),
        _ => None,
    }
}

/// IAM's action wildcards: `*` any run, `?` one character.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests;
