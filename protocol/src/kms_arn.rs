//! [`KmsKeyArn`]: the full ARN of a KMS key, the one form under which a key can be pinned.
//!
//! KMS answers `Decrypt` with the key's ARN (`KeyId`), never an alias or a bare key id, so the
//! enclave asks with an ARN and compares the answer byte for byte, and a client compares the ARN
//! an attestation binding names with its deployment's. Anything else (an alias, a key id, an
//! alias ARN) is refused: it names a key only through a lookup the host could steer.
//!
//! ```text
//! arn:<partition>:kms:<region>:<12-digit account>:key/<key id>
//! ```

use std::fmt;
use std::str::FromStr;

/// Longest ARN accepted (KMS's own are under 100 bytes; the binding must fit `user_data`).
pub const MAX_KMS_KEY_ARN_LEN: usize = 256;

/// A syntactically valid KMS key ARN.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KmsKeyArn(String);

/// Why a string is not a KMS key ARN.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a KMS key ARN (arn:<partition>:kms:<region>:<account>:key/<id>): {reason}")]
pub struct KmsKeyArnError {
    pub text: String,
    pub reason: &'static str,
}

impl KmsKeyArn {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The partition part (`aws`, `aws-cn`, `aws-us-gov`).
    pub fn partition(&self) -> &str {
        self.0.split(':').nth(1).unwrap_or_default()
    }

    /// The region part (`us-east-1`, `local`).
    pub fn region(&self) -> &str {
        self.0.split(':').nth(3).unwrap_or_default()
    }

    /// The account part (12 digits).
    pub fn account(&self) -> &str {
        self.0.split(':').nth(4).unwrap_or_default()
    }
}

impl FromStr for KmsKeyArn {
    type Err = KmsKeyArnError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let refuse = |reason| KmsKeyArnError { text: text.chars().take(MAX_KMS_KEY_ARN_LEN).collect(), reason };
        if text.is_empty() || text.len() > MAX_KMS_KEY_ARN_LEN {
            return Err(refuse("empty or longer than 256 bytes"));
        }
        let token = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        let parts: Vec<&str> = text.split(':').collect();
        let [arn, partition, service, region, account, resource] = parts.as_slice() else {
            return Err(refuse("not six colon-separated parts"));
        };
        if *arn != "arn" || *service != "kms" {
            return Err(refuse("not an arn:…:kms: name"));
        }
        if !token(partition) || !token(region) {
            return Err(refuse("partition or region is not lowercase letters, digits and '-'"));
        }
        if account.len() != 12 || !account.bytes().all(|b| b.is_ascii_digit()) {
            return Err(refuse("the account is not 12 digits"));
        }
        let Some(key) = resource.strip_prefix("key/") else {
            return Err(refuse("names no key/ (an alias is resolved by whoever answers, so it pins nothing)"));
        };
        if !token(key) {
            return Err(refuse("the key id is not lowercase letters, digits and '-'"));
        }
        Ok(KmsKeyArn(text.to_owned()))
    }
}

impl fmt::Display for KmsKeyArn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for KmsKeyArn {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for KmsKeyArn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_arns_only() {
        let good = "arn:aws:kms:eu-central-2:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab";
        let arn: KmsKeyArn = good.parse().unwrap();
        assert_eq!(arn.region(), "eu-central-2");
        assert_eq!(arn.account(), "123456789012");
        assert!("arn:aws-us-gov:kms:us-gov-west-1:123456789012:key/mrk-1234abcd".parse::<KmsKeyArn>().is_ok());
        assert!("arn:aws:kms:local:000000000000:key/0f0e".parse::<KmsKeyArn>().is_ok());
        for bad in [
            "",
            "alias/ephem-fleet",
            "1234abcd-12ab-34cd-56ef-1234567890ab",
            "arn:aws:kms:us-east-1:123456789012:alias/ephem-fleet",
            "arn:aws:s3:us-east-1:123456789012:key/k",
            "arn:aws:kms:us-east-1:12345678901:key/k",
            "arn:aws:kms:US-EAST-1:123456789012:key/k",
            "arn:aws:kms:us-east-1:123456789012:key/",
            "arn:aws:kms:us-east-1:123456789012:key/k:extra",
            "arn:aws:kms:us-east-1:123456789012:key/K\n",
        ] {
            assert!(bad.parse::<KmsKeyArn>().is_err(), "{bad:?}");
        }
        assert!(format!("arn:aws:kms:r:123456789012:key/{}", "a".repeat(300)).parse::<KmsKeyArn>().is_err());
    }
}
