//! `ephem-batch fleet check-key`: is the deployment's fleet KMS key one that releases only to the
//! measured image and wraps nothing anyone chose? (docs/protocol.md §7.3)
//!
//! Pinning the fleet key's ARN (check `fleet_kms_key`) is only as strong as the key: a key that
//! lets anyone `Encrypt`, import material, or return plaintext outside an attested enclave would
//! let that someone wrap a fleet private key they know, which the genuine enclave then attests.
//! A compliance team runs this once per key (keys are never edited after deployment) with the
//! key's own metadata and policy, read with its own credentials.

use std::collections::BTreeMap;

use cloud::KeyDescription;
use protocol::attestation::Policy;
use protocol::kms_arn::KmsKeyArn;
use serde::Serialize;
use serde_json::Value;

/// The checks, in the order they run. Every one is evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyCheck {
    /// The described key is the pinned one.
    KeyArn,
    /// The key is enabled.
    KeyState,
    /// KMS made the key material (origin `AWS_KMS`): nobody can have imported material they know.
    KeyOrigin,
    /// A symmetric encryption key.
    KeySpec,
    /// Not multi-Region: a replica would carry the same material under a policy of its own.
    KeyMultiRegion,
    /// The policy is a readable IAM document without `NotAction`/`NotPrincipal` allows.
    KeyPolicyDocument,
    /// No statement allows an operation that wraps chosen material or edits the key's rules.
    KeyPolicyNoWrapping,
    /// Every allowed release (`Decrypt`, `GenerateDataKey`, `GenerateDataKeyPair`) is conditioned
    /// on the signed policy's PCR0, and one such statement exists.
    KeyPolicyAttestedRelease,
}

impl KeyCheck {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyCheck::KeyArn => "key_arn",
            KeyCheck::KeyState => "key_state",
            KeyCheck::KeyOrigin => "key_origin",
            KeyCheck::KeySpec => "key_spec",
            KeyCheck::KeyMultiRegion => "key_multi_region",
            KeyCheck::KeyPolicyDocument => "key_policy_document",
            KeyCheck::KeyPolicyNoWrapping => "key_policy_no_wrapping",
            KeyCheck::KeyPolicyAttestedRelease => "key_policy_attested_release",
        }
    }
}

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

/// The condition keys KMS sets from a `Recipient` document's PCR0.
const PCR0_CONDITION_KEYS: [&str; 2] = ["kms:recipientattestation:imagesha384", "kms:recipientattestation:pcr0"];

#[derive(Debug, Clone, Serialize)]
pub struct CheckOutcome {
    pub name: KeyCheck,
    pub passed: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
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

    pub fn print(&self) {
        println!("fleet key {}", self.key);
        for check in &self.checks {
            let mark = if check.passed { "ok  " } else { "FAIL" };
            println!("{mark}  {:28}  {}", check.name.as_str(), check.detail);
        }
        println!("{}", if self.passed() { "the key releases only to the measured image" } else { "NOT a key clients may pin" });
    }
}

/// Runs every check on a described key against the pinned ARN and the signed policy's PCR0.
pub fn check(described: &KeyDescription, pinned: &KmsKeyArn, policy: &Policy) -> KeyReport {
    let mut checks = Vec::new();
    let mut record = |name, result: Result<String, String>| {
        let (passed, detail) = match result {
            Ok(detail) => (true, detail),
            Err(detail) => (false, detail),
        };
        checks.push(CheckOutcome { name, passed, detail });
    };
    let is = |ok: bool, good: String, bad: String| if ok { Ok(good) } else { Err(bad) };
    record(
        KeyCheck::KeyArn,
        is(described.arn == pinned.as_str(), format!("{} is the pinned key", described.arn), format!("described {}, pinned {pinned}", described.arn)),
    );
    record(KeyCheck::KeyState, is(described.enabled, "enabled".into(), "disabled".into()));
    record(
        KeyCheck::KeyOrigin,
        is(described.origin == "AWS_KMS", "AWS_KMS: KMS made the material".into(), format!("origin {:?}: material may be known outside KMS", described.origin)),
    );
    let spec_ok = described.key_spec == "SYMMETRIC_DEFAULT" && described.key_usage == "ENCRYPT_DECRYPT";
    record(KeyCheck::KeySpec, is(spec_ok, "SYMMETRIC_DEFAULT, ENCRYPT_DECRYPT".into(), format!("{} / {}", described.key_spec, described.key_usage)));
    record(
        KeyCheck::KeyMultiRegion,
        is(!described.multi_region, "single-Region".into(), "multi-Region: replicas share the material under their own policies".into()),
    );
    let pcr0 = policy.pcrs.get(&0).map(hex::encode);
    match Statements::parse(&described.policy) {
        Err(error) => {
            record(KeyCheck::KeyPolicyDocument, Err(error));
            record(KeyCheck::KeyPolicyNoWrapping, Err("not evaluated: the policy does not parse".into()));
            record(KeyCheck::KeyPolicyAttestedRelease, Err("not evaluated: the policy does not parse".into()));
        }
        Ok(statements) => {
            record(KeyCheck::KeyPolicyDocument, Ok(format!("{} statements", statements.0.len())));
            record(KeyCheck::KeyPolicyNoWrapping, statements.no_wrapping());
            record(KeyCheck::KeyPolicyAttestedRelease, statements.attested_release(pcr0.as_deref()));
        }
    }
    KeyReport { key: described.arn.clone(), checks }
}

/// The Allow statements of a key policy: (sid, actions, conditions operator → key → values).
struct Statements(Vec<Allow>);

struct Allow {
    sid: String,
    actions: Vec<String>,
    conditions: BTreeMap<String, BTreeMap<String, Vec<String>>>,
}

impl Statements {
    fn parse(text: &str) -> Result<Statements, String> {
        let document: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let statements = match &document["Statement"] {
            Value::Array(list) => list.clone(),
            one @ Value::Object(_) => vec![one.clone()],
            _ => return Err("no Statement".into()),
        };
        let mut allows = Vec::new();
        for (i, statement) in statements.iter().enumerate() {
            let sid = statement["Sid"].as_str().map_or_else(|| format!("#{i}"), str::to_owned);
            match statement["Effect"].as_str() {
                Some("Deny") => continue,
                Some("Allow") => {}
                other => return Err(format!("statement {sid}: Effect {other:?}")),
            }
            if statement.get("NotAction").is_some() || statement.get("NotPrincipal").is_some() {
                return Err(format!("statement {sid} allows with NotAction/NotPrincipal: everything but a list"));
            }
            let actions = strings(&statement["Action"]).ok_or_else(|| format!("statement {sid}: Action is not a string or list"))?;
            let mut conditions = BTreeMap::new();
            if let Some(map) = statement.get("Condition").and_then(Value::as_object) {
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
            allows.push(Allow { sid, actions, conditions });
        }
        Ok(Statements(allows))
    }

    fn no_wrapping(&self) -> Result<String, String> {
        let granted: Vec<String> = self
            .0
            .iter()
            .flat_map(|s| FORBIDDEN_ACTIONS.iter().filter(|a| s.grants(a)).map(move |a| format!("{} allows {a}", s.sid)))
            .collect();
        if granted.is_empty() {
            Ok(format!("nobody may {}", FORBIDDEN_ACTIONS.join(", ")))
        } else {
            Err(granted.join("; "))
        }
    }

    fn attested_release(&self, pcr0: Option<&str>) -> Result<String, String> {
        let pcr0 = pcr0.ok_or("the signed policy names no PCR0")?;
        let mut attested = 0;
        for statement in &self.0 {
            let released: Vec<&str> = RELEASE_ACTIONS.iter().copied().filter(|a| statement.grants(a)).collect();
            if released.is_empty() {
                continue;
            }
            if !statement.requires_pcr0(pcr0) {
                return Err(format!("{} allows {} without requiring PCR0 = the policy's {pcr0}", statement.sid, released.join(", ")));
            }
            attested += 1;
        }
        if attested == 0 {
            return Err("no statement lets an attested enclave decrypt".into());
        }
        Ok(format!("{attested} statement(s) release only to PCR0 {}…", &pcr0[..16.min(pcr0.len())]))
    }
}

impl Allow {
    fn grants(&self, action: &str) -> bool {
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
