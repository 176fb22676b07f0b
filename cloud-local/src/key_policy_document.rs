//! A local key's policy as the IAM policy document the deployment's key would carry
//! (cdk/lib/keys.ts), so that one checker (`ephem-batch fleet check-key`) reads both.
//!
//! The rendering is faithful to what the local KMS enforces ([`LocalKms`](super::LocalKms)'s
//! `authorize`): every operation it would allow appears in an Allow statement, with the
//! attestation and encryption-context conditions it checks; nothing it refuses does.

use serde_json::{Value, json};

use super::kms::{LOCAL_ACCOUNT_ROOT, LocalKeyPolicy};

impl LocalKeyPolicy {
    /// The equivalent IAM key policy document.
    pub fn to_iam_policy(&self) -> Value {
        let principal = json!({ "AWS": LOCAL_ACCOUNT_ROOT });
        let attested: serde_json::Map<String, Value> = self
            .recipient_pcrs
            .iter()
            .map(|(index, value)| (condition_key(*index), Value::String(hex::encode(value))))
            .collect();
        let context_present: serde_json::Map<String, Value> = self
            .required_context_keys
            .iter()
            .map(|k| (format!("kms:EncryptionContext:{k}"), Value::String("false".into())))
            .collect();
        let mut conditions = serde_json::Map::new();
        if !context_present.is_empty() {
            conditions.insert("Null".into(), Value::Object(context_present.clone()));
        }
        let mut statements = vec![json!({
            "Sid": "AllowAccountReadKeyPolicy",
            "Effect": "Allow",
            "Principal": principal,
            "Action": ["kms:DescribeKey", "kms:GetKeyPolicy", "kms:ListGrants"],
            "Resource": "*",
        })];
        let mut release = vec!["kms:Decrypt"];
        if self.allow_generate_data_key {
            release.push("kms:GenerateDataKey");
        }
        if self.allow_generate_data_key_pair && self.require_recipient {
            release.push("kms:GenerateDataKeyPair");
        }
        let mut release_conditions = conditions.clone();
        if self.require_recipient {
            release_conditions.insert("StringEqualsIgnoreCase".into(), Value::Object(attested.clone()));
        }
        statements.push(statement("AllowRelease", &principal, &release, release_conditions));
        if self.allow_encrypt {
            statements.push(statement("AllowEncrypt", &principal, &["kms:Encrypt"], conditions.clone()));
        }
        if self.allow_generate_data_key_pair {
            let pair = ["kms:GenerateDataKeyPairWithoutPlaintext"];
            statements.push(statement("AllowGenerateDataKeyPairWithoutPlaintext", &principal, &pair, conditions.clone()));
        }
        if self.require_recipient {
            // Every release operation, whether or not this key allows it (as the deployment's do).
            let all_release = ["kms:Decrypt", "kms:GenerateDataKey", "kms:GenerateDataKeyPair"];
            for (key, value) in &attested {
                let name = key.rsplit(':').next().unwrap_or_default();
                statements.push(json!({
                    "Sid": format!("DenyReleaseWithout{name}"),
                    "Effect": "Deny",
                    "Principal": "*",
                    "Action": all_release,
                    "Resource": "*",
                    "Condition": { "Null": { key: "true" } },
                }));
                statements.push(json!({
                    "Sid": format!("DenyReleaseToOther{name}"),
                    "Effect": "Deny",
                    "Principal": "*",
                    "Action": all_release,
                    "Resource": "*",
                    "Condition": { "StringNotEqualsIgnoreCase": { key: value } },
                }));
            }
        }
        if self.deny_wrapping {
            statements.push(json!({
                "Sid": "DenyWrappingAndPolicyChanges",
                "Effect": "Deny",
                "Principal": "*",
                "Action": ["kms:Encrypt", "kms:ReEncrypt*", "kms:CreateGrant", "kms:PutKeyPolicy", "kms:Import*"],
                "Resource": "*",
            }));
        }
        json!({ "Version": "2012-10-17", "Id": "ephem-batch-local", "Statement": statements })
    }
}

fn statement(sid: &str, principal: &Value, actions: &[&str], conditions: serde_json::Map<String, Value>) -> Value {
    let mut s = json!({ "Sid": sid, "Effect": "Allow", "Principal": principal, "Action": actions, "Resource": "*" });
    if !conditions.is_empty() {
        s["Condition"] = Value::Object(conditions);
    }
    s
}

/// The condition key KMS sets from a document's PCR.
pub(super) fn condition_key(index: u8) -> String {
    match index {
        0 => "kms:RecipientAttestation:ImageSha384".to_owned(),
        n => format!("kms:RecipientAttestation:PCR{n}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fleet_policy_allows_only_attested_release_and_epoch_creation() {
        let doc = LocalKeyPolicy::fleet(vec![0xab; 48], None).to_iam_policy();
        let text = doc.to_string();
        assert!(text.contains(&"ab".repeat(48)), "{text}");
        let allows_encrypt = doc["Statement"].as_array().unwrap().iter().any(|statement| {
            statement["Effect"] == "Allow" && statement["Action"].as_array().unwrap().iter().any(|a| a == "kms:Encrypt")
        });
        assert!(!allows_encrypt, "{text}");
        assert!(text.contains("DenyWrappingAndPolicyChanges"), "the fleet key denies Encrypt to everyone: {text}");
        assert!(text.contains("GenerateDataKeyPairWithoutPlaintext"));
        let unrestricted = LocalKeyPolicy::unrestricted().to_iam_policy().to_string();
        assert!(unrestricted.contains("kms:Encrypt") && !unrestricted.contains("RecipientAttestation"), "{unrestricted}");
    }
}
