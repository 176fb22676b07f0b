//! [`LocalKms`]: a KMS stand-in that keeps its keys in SQLite and enforces what the real key
//! policies enforce (DESIGN.md §3), including `Recipient`.
//!
//! * **Keys** are 32 random bytes each, with a [`LocalKeyPolicy`] (JSON) fixed at creation:
//!   there is no way to edit a policy afterwards, as in the deployment. Key ids are ARNs,
//!   `arn:aws:kms:local:000000000000:key/<uuid>`; aliases `alias/<name>` point to them.
//! * **Ciphertext blobs** are this module's own versioned format (see [`blob`]): they name their
//!   key, and an XChaCha20-Poly1305 AEAD binds the key id and the encryption context, so a blob
//!   opens only under the same key and the same context.
//! * **Recipient**: as KMS does, the attestation document is verified (signature, chain to the
//!   pinned root, validity, freshness) with the project's verifier, the key policy's PCR
//!   conditions are checked on the *verified* document, and the plaintext is returned only as
//!   `CiphertextForRecipient` — a BER CMS EnvelopedData to the document's RSA `public_key`.
//!   The root is read from its PEM file at each request, because the development CA only
//!   appears when the enclave worker first boots.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use chacha20poly1305::aead::AeadInOut;
use chacha20poly1305::{KeyInit, XChaCha20Poly1305, XNonce};
use protocol::attestation::{TrustAnchor, VerifyOptions};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::key_policy_document::condition_key;
use super::sqlite;
use cloud::kms::{
    AwsCredentials, DataKey, DataKeyPair, DataKeyPairForRecipient, Decrypted, EncryptionContext, GrantSummary, KeyDescription,
    KeyEvidence, KeyMetadata, Kms, KmsError, Recipient,
};
use cloud::now_ms;

/// Key ARNs of the local KMS: a fixed pseudo-region and account.
pub const KEY_ARN_PREFIX: &str = "arn:aws:kms:local:000000000000:key/";
pub const ALIAS_ARN_PREFIX: &str = "arn:aws:kms:local:000000000000:";
/// The local account's root principal, as rendered key policies name it.
pub const LOCAL_ACCOUNT_ROOT: &str = "arn:aws:iam::000000000000:root";
/// KMS's limit on `Encrypt` plaintext.
pub const MAX_ENCRYPT_PLAINTEXT: usize = 4096;
/// Access key id (and secret) of the local KMS: the endpoint does not check SigV4.
pub const LOCAL_ACCESS_KEY_ID: &str = "local";
/// `GenerateDataKey` with key spec AES_256.
pub const DATA_KEY_LEN: usize = 32;
/// The length of a PCR (SHA-384).
pub const PCR_LEN: usize = 48;

/// How `Recipient` attestation documents are verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttestationTrust {
    /// The pinned root certificate (PEM), read at each `Recipient` request.
    pub root_pem_path: PathBuf,
    /// KMS accepts documents at most this old (five minutes on AWS).
    pub max_document_age: Duration,
}

/// What a key's policy allows; the local form of the statements in DESIGN.md §3.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalKeyPolicy {
    /// The `kms:RecipientAttestation:*` conditions: PCR index → required value (PCR0 is
    /// `ImageSha384`). Checked on every `Recipient` document.
    #[serde(with = "pcr_hex")]
    pub recipient_pcrs: BTreeMap<u8, Vec<u8>>,
    /// `Decrypt` and `GenerateDataKey` only with a `Recipient`: the explicit Deny when the
    /// attestation condition is absent, so no caller ever gets plaintext.
    pub require_recipient: bool,
    /// `Encrypt` (the model publisher wraps a data key it generated itself).
    pub allow_encrypt: bool,
    /// `GenerateDataKey`.
    pub allow_generate_data_key: bool,
    /// `GenerateDataKeyPairWithoutPlaintext` (fleet-key rotation).
    pub allow_generate_data_key_pair: bool,
    /// Encryption-context keys every request must carry (the policies' `Null` conditions).
    pub required_context_keys: Vec<String>,
    /// The explicit Deny, for everyone, of `Encrypt`, `ReEncrypt*`, `CreateGrant`,
    /// `PutKeyPolicy` and `Import*`: it overrides any grant. Off in policies written before
    /// the deny list held `Encrypt` (stored policies without the field read as such).
    #[serde(default)]
    pub deny_wrapping: bool,
}

impl LocalKeyPolicy {
    /// The fleet key: `Decrypt` and `GenerateDataKeyPair` only to an enclave with these
    /// measurements, under {epoch, not_after}; nobody may wrap anything under it or change it.
    pub fn fleet(pcr0: impl Into<Vec<u8>>, pcr8: Option<Vec<u8>>) -> LocalKeyPolicy {
        LocalKeyPolicy {
            recipient_pcrs: pcrs(pcr0.into(), pcr8),
            require_recipient: true,
            allow_encrypt: false,
            allow_generate_data_key: false,
            allow_generate_data_key_pair: true,
            required_context_keys: vec!["epoch".into(), "not_after".into()],
            deny_wrapping: true,
        }
    }

    /// The model key: `Decrypt` and `GenerateDataKey` only to an enclave with these
    /// measurements; the publisher may `Encrypt` under {model_id, version}.
    pub fn model(pcr0: impl Into<Vec<u8>>, pcr8: Option<Vec<u8>>) -> LocalKeyPolicy {
        LocalKeyPolicy {
            recipient_pcrs: pcrs(pcr0.into(), pcr8),
            require_recipient: true,
            allow_encrypt: true,
            allow_generate_data_key: true,
            allow_generate_data_key_pair: false,
            required_context_keys: vec!["model_id".into(), "version".into()],
            deny_wrapping: false,
        }
    }

    /// Every operation, plaintext to the caller allowed: for tests of other components only.
    pub fn unrestricted() -> LocalKeyPolicy {
        LocalKeyPolicy {
            recipient_pcrs: BTreeMap::new(),
            require_recipient: false,
            allow_encrypt: true,
            allow_generate_data_key: true,
            allow_generate_data_key_pair: true,
            required_context_keys: Vec::new(),
            deny_wrapping: false,
        }
    }

    /// Refuses a policy that would not protect what it claims to.
    pub fn validate(&self) -> Result<(), KmsError> {
        if self.require_recipient && !self.recipient_pcrs.contains_key(&0) {
            return Err(KmsError::Validation(
                "a key policy that requires a Recipient must pin PCR0 (kms:RecipientAttestation:ImageSha384)".into(),
            ));
        }
        for (index, value) in &self.recipient_pcrs {
            if *index > 31 || value.len() != PCR_LEN {
                return Err(KmsError::Validation(format!(
                    "key policy PCR{index}: PCRs are 0..=31 with {PCR_LEN}-byte values, got {} bytes",
                    value.len()
                )));
            }
        }
        Ok(())
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    pub fn from_json(text: &str) -> Result<LocalKeyPolicy, KmsError> {
        serde_json::from_str(text).map_err(|e| KmsError::Validation(format!("key policy JSON: {e}")))
    }
}

fn pcrs(pcr0: Vec<u8>, pcr8: Option<Vec<u8>>) -> BTreeMap<u8, Vec<u8>> {
    let mut map = BTreeMap::from([(0, pcr0)]);
    if let Some(pcr8) = pcr8 {
        map.insert(8, pcr8);
    }
    map
}

/// PCR values as hex strings in JSON.
mod pcr_hex {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(map: &BTreeMap<u8, Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        map.iter().map(|(k, v)| (*k, hex::encode(v))).collect::<BTreeMap<u8, String>>().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<u8, Vec<u8>>, D::Error> {
        BTreeMap::<u8, String>::deserialize(d)?
            .into_iter()
            .map(|(k, v)| hex::decode(&v).map(|b| (k, b)).map_err(serde::de::Error::custom))
            .collect()
    }
}

/// The ciphertext blob, version 1:
///
/// ```text
/// "eKMS" | 0x01 | key id length (u16 BE) | key id (UTF-8 ARN) | nonce (24) | ciphertext ‖ tag (16)
/// ```
///
/// XChaCha20-Poly1305 under the key's material; AAD = everything before the nonce ‖ the
/// canonical encoding of the encryption context. Random 192-bit nonces never repeat in practice.
pub mod blob {
    use super::*;

    pub const MAGIC: &[u8; 4] = b"eKMS";
    pub const VERSION: u8 = 1;
    pub const NONCE_LEN: usize = 24;
    pub const TAG_LEN: usize = 16;

    /// A parsed (not yet authenticated) blob.
    #[derive(Debug)]
    pub struct Blob<'a> {
        pub key_id: &'a str,
        /// Magic, version and key id: authenticated as AAD.
        header: &'a [u8],
        nonce: &'a [u8],
        sealed: &'a [u8],
    }

    impl<'a> Blob<'a> {
        pub fn parse(bytes: &'a [u8]) -> Result<Blob<'a>, KmsError> {
            let bad = |why: &str| KmsError::InvalidCiphertext(format!("not a local KMS ciphertext blob: {why}"));
            if bytes.len() < 7 || &bytes[..4] != MAGIC {
                return Err(bad("no eKMS header"));
            }
            if bytes[4] != VERSION {
                return Err(bad(&format!("unknown version {}", bytes[4])));
            }
            let id_len = usize::from(u16::from_be_bytes([bytes[5], bytes[6]]));
            let header_len = 7 + id_len;
            if bytes.len() < header_len + NONCE_LEN + TAG_LEN {
                return Err(bad("truncated"));
            }
            let key_id = std::str::from_utf8(&bytes[7..header_len]).map_err(|_| bad("key id is not UTF-8"))?;
            Ok(Blob {
                key_id,
                header: &bytes[..header_len],
                nonce: &bytes[header_len..header_len + NONCE_LEN],
                sealed: &bytes[header_len + NONCE_LEN..],
            })
        }

        pub fn open(&self, material: &[u8; 32], context: &EncryptionContext) -> Result<Zeroizing<Vec<u8>>, KmsError> {
            let cipher = XChaCha20Poly1305::new(material.into());
            let nonce = XNonce::try_from(self.nonce).map_err(|_| KmsError::InvalidCiphertext("bad nonce".into()))?;
            let mut buffer = Zeroizing::new(self.sealed.to_vec());
            cipher.decrypt_in_place(&nonce, &aad(self.header, context), &mut *buffer).map_err(|_| {
                KmsError::InvalidCiphertext(format!(
                    "the ciphertext does not authenticate under key {}: the encryption context differs or the blob was altered",
                    self.key_id
                ))
            })?;
            Ok(buffer)
        }
    }

    pub fn seal(key_id: &str, material: &[u8; 32], plaintext: &[u8], context: &EncryptionContext) -> Result<Vec<u8>, KmsError> {
        let id_len = u16::try_from(key_id.len()).map_err(|_| KmsError::Validation("key id too long".into()))?;
        let mut out = Vec::with_capacity(7 + key_id.len() + NONCE_LEN + plaintext.len() + TAG_LEN);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&id_len.to_be_bytes());
        out.extend_from_slice(key_id.as_bytes());
        let header_len = out.len();
        let nonce_bytes: [u8; NONCE_LEN] = random()?;
        out.extend_from_slice(&nonce_bytes);
        let mut sealed = plaintext.to_vec();
        let cipher = XChaCha20Poly1305::new(material.into());
        cipher
            .encrypt_in_place(&XNonce::from(nonce_bytes), &aad(&out[..header_len], context), &mut sealed)
            .map_err(|_| KmsError::Validation("plaintext too long".into()))?;
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// header ‖ count (u32 BE) ‖ for each pair in key order: len ‖ key ‖ len ‖ value (u32 BE
    /// lengths) — unambiguous, so no two contexts share an encoding.
    fn aad(header: &[u8], context: &EncryptionContext) -> Vec<u8> {
        let mut out = header.to_vec();
        let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes();
        out.extend_from_slice(&len(context.len()));
        for (k, v) in context {
            out.extend_from_slice(&len(k.len()));
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(&len(v.len()));
            out.extend_from_slice(v.as_bytes());
        }
        out
    }
}

/// The local KMS (see the module documentation).
pub struct LocalKms {
    path: PathBuf,
    trust: AttestationTrust,
    conn: Mutex<Connection>,
}

impl std::fmt::Debug for LocalKms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalKms").field("path", &self.path).field("trust", &self.trust).finish()
    }
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS keys (
    key_id      TEXT PRIMARY KEY,
    material    BLOB NOT NULL,
    policy      TEXT NOT NULL,
    description TEXT NOT NULL,
    created_ms  INTEGER NOT NULL,
    enabled     INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS grants (
    grant_id   TEXT PRIMARY KEY,
    key_id     TEXT NOT NULL REFERENCES keys (key_id),
    grantee    TEXT NOT NULL,
    operations TEXT NOT NULL,
    created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS aliases (
    alias      TEXT PRIMARY KEY,
    key_id     TEXT NOT NULL REFERENCES keys (key_id),
    updated_ms INTEGER NOT NULL
);
";

/// A key as loaded for one operation.
struct KeyRecord {
    key_id: String,
    material: Zeroizing<[u8; 32]>,
    policy: LocalKeyPolicy,
    enabled: bool,
    /// The operations the key's grants allow (KMS names: `Encrypt`, `Decrypt`, …).
    granted: Vec<String>,
}

/// The operations a policy speaks about, for messages.
#[derive(Clone, Copy)]
enum Op {
    Encrypt,
    Decrypt,
    GenerateDataKey,
    GenerateDataKeyPair,
    /// `GenerateDataKeyPair` with plaintext (to a `Recipient`).
    GenerateDataKeyPairForRecipient,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Encrypt => "Encrypt",
            Op::Decrypt => "Decrypt",
            Op::GenerateDataKey => "GenerateDataKey",
            Op::GenerateDataKeyPair => "GenerateDataKeyPairWithoutPlaintext",
            Op::GenerateDataKeyPairForRecipient => "GenerateDataKeyPair",
        }
    }
}

impl LocalKms {
    /// Opens (creating if needed) the key database at `db_path`, readable by its owner only.
    pub fn open(db_path: impl AsRef<Path>, trust: AttestationTrust) -> Result<LocalKms, KmsError> {
        let path = db_path.as_ref().to_path_buf();
        let conn = sqlite::open_with_setup(&path, true, |tx| tx.execute_batch(SCHEMA)).map_err(|e| db_error(&path, e))?;
        Ok(LocalKms { path, trust, conn: Mutex::new(conn) })
    }

    pub fn trust(&self) -> &AttestationTrust {
        &self.trust
    }

    /// Creates a key with a fixed policy; returns its ARN.
    pub fn create_key(&self, policy: LocalKeyPolicy, description: &str) -> Result<String, KmsError> {
        policy.validate()?;
        let id = random_hex::<16>()?;
        let key_id = format!("{KEY_ARN_PREFIX}{}-{}-{}-{}-{}", &id[..8], &id[8..12], &id[12..16], &id[16..20], &id[20..]);
        let material = Zeroizing::new(random::<32>()?);
        let conn = self.conn();
        conn.execute(
            "INSERT INTO keys (key_id, material, policy, description, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![key_id, &material[..], policy.to_json(), description, db_ms(now_ms())],
        )
        .map_err(|e| self.db(e))?;
        Ok(key_id)
    }

    /// Creates `alias` (`alias/<name>`) or points it at another key.
    pub fn set_alias(&self, alias: &str, key_id: &str) -> Result<(), KmsError> {
        let name = alias.strip_prefix("alias/").unwrap_or_default();
        let valid = !name.is_empty()
            && alias.len() <= 256
            && !name.starts_with("aws/")
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"/_-".contains(&b));
        if !valid {
            return Err(KmsError::Validation(format!(
                "{alias:?} is not an alias name (alias/<name>, [A-Za-z0-9/_-], not alias/aws/…)"
            )));
        }
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| self.db(e))?;
        let target = resolve_in(&tx, key_id).map_err(|e| self.db(e))?.ok_or_else(|| KmsError::NotFound { key_id: key_id.to_owned() })?;
        tx.execute(
            "INSERT INTO aliases (alias, key_id, updated_ms) VALUES (?1, ?2, ?3)
             ON CONFLICT (alias) DO UPDATE SET key_id = ?2, updated_ms = ?3",
            params![alias, target, db_ms(now_ms())],
        )
        .map_err(|e| self.db(e))?;
        tx.commit().map_err(|e| self.db(e))
    }

    /// The key ARN named by a key id, key ARN, alias name or alias ARN.
    pub fn resolve(&self, key_id_or_alias: &str) -> Result<String, KmsError> {
        let conn = self.conn();
        resolve_in(&conn, key_id_or_alias)
            .map_err(|e| self.db(e))?
            .ok_or_else(|| KmsError::NotFound { key_id: key_id_or_alias.to_owned() })
    }

    /// The key's policy (KMS `GetKeyPolicy`).
    pub fn key_policy(&self, key_id: &str) -> Result<LocalKeyPolicy, KmsError> {
        Ok(self.load(key_id)?.policy)
    }

    /// Every alias and the key ARN it points to, by alias.
    pub fn aliases(&self) -> Result<Vec<(String, String)>, KmsError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT alias, key_id FROM aliases ORDER BY alias").map_err(|e| self.db(e))?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).map_err(|e| self.db(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.db(e))
    }

    /// KMS `CreateGrant`, as an account could call it before a key's policy denied it (grants
    /// outlive the policy that allowed them): `grantee` may then perform `operations` on the key
    /// unless the key policy explicitly denies them. Returns the grant id.
    pub fn create_grant(&self, key_id: &str, grantee: &str, operations: &[&str]) -> Result<String, KmsError> {
        let key_id = self.resolve(key_id)?;
        let grant_id = random_hex::<32>()?;
        let operations = serde_json::to_string(operations).unwrap_or_default();
        self.conn()
            .execute(
                "INSERT INTO grants (grant_id, key_id, grantee, operations, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![grant_id, key_id, grantee, operations, db_ms(now_ms())],
            )
            .map_err(|e| self.db(e))?;
        Ok(grant_id)
    }

    /// KMS `ListGrants`: (grant id, grantee, operations) of the key.
    pub fn grants(&self, key_id: &str) -> Result<Vec<(String, String, Vec<String>)>, KmsError> {
        let key_id = self.resolve(key_id)?;
        let conn = self.conn();
        grants_in(&conn, &key_id).map_err(|e| self.db(e))
    }

    /// KMS `EnableKey` / `DisableKey`: a disabled key refuses every operation.
    pub fn set_key_enabled(&self, key_id: &str, enabled: bool) -> Result<(), KmsError> {
        let key_id = self.resolve(key_id)?;
        self.conn()
            .execute("UPDATE keys SET enabled = ?1 WHERE key_id = ?2", params![enabled, key_id])
            .map_err(|e| self.db(e))?;
        Ok(())
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn db(&self, e: rusqlite::Error) -> KmsError {
        db_error(&self.path, e)
    }

    fn load(&self, key_id_or_alias: &str) -> Result<KeyRecord, KmsError> {
        let conn = self.conn();
        let not_found = || KmsError::NotFound { key_id: key_id_or_alias.to_owned() };
        let key_id = resolve_in(&conn, key_id_or_alias).map_err(|e| self.db(e))?.ok_or_else(not_found)?;
        let (material, policy, enabled): (Vec<u8>, String, bool) = conn
            .query_row("SELECT material, policy, enabled FROM keys WHERE key_id = ?1", [&key_id], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()
            .map_err(|e| self.db(e))?
            .ok_or_else(not_found)?;
        let material = Zeroizing::new(
            <[u8; 32]>::try_from(material.as_slice())
                .map_err(|_| KmsError::Unavailable(format!("key {key_id}: stored key material is not 32 bytes")))?,
        );
        let policy = LocalKeyPolicy::from_json(&policy)
            .map_err(|e| KmsError::Unavailable(format!("key {key_id}: stored policy does not parse: {e}")))?;
        let granted = grants_in(&conn, &key_id).map_err(|e| self.db(e))?.into_iter().flat_map(|(_, _, ops)| ops).collect();
        Ok(KeyRecord { key_id, material, policy, enabled, granted })
    }

    /// Loads a key for `op` and applies everything its policy says about the request.
    /// Returns the key and, for a `Recipient` request, the verified RSA public key to seal to.
    fn authorize(
        &self,
        key_id: &str,
        op: Op,
        context: &EncryptionContext,
        recipient: Option<&Recipient>,
    ) -> Result<(KeyRecord, Option<Vec<u8>>), KmsError> {
        let key = self.load(key_id)?;
        self.authorize_loaded(key, op, context, recipient)
    }

    fn authorize_loaded(
        &self,
        key: KeyRecord,
        op: Op,
        context: &EncryptionContext,
        recipient: Option<&Recipient>,
    ) -> Result<(KeyRecord, Option<Vec<u8>>), KmsError> {
        if !key.enabled {
            return Err(KmsError::Disabled { key_id: key.key_id });
        }
        let policy = &key.policy;
        let by_policy = match op {
            Op::Encrypt => policy.allow_encrypt,
            Op::Decrypt => true,
            Op::GenerateDataKey => policy.allow_generate_data_key,
            Op::GenerateDataKeyPair | Op::GenerateDataKeyPairForRecipient => policy.allow_generate_data_key_pair,
        };
        let by_grant = key.granted.iter().any(|granted| granted == op.name());
        if matches!(op, Op::Encrypt) && policy.deny_wrapping {
            return Err(KmsError::AccessDenied(format!("Encrypt is explicitly denied by the key policy of {}", key.key_id)));
        }
        if !by_policy && !by_grant {
            return Err(KmsError::AccessDenied(format!("{} is not allowed by the key policy of {}", op.name(), key.key_id)));
        }
        if let Some(missing) = policy.required_context_keys.iter().find(|k| !context.contains_key(*k)) {
            return Err(KmsError::AccessDenied(format!(
                "{} without encryption context key `{missing}` is denied by the key policy of {}",
                op.name(),
                key.key_id
            )));
        }
        let releases_plaintext = matches!(op, Op::Decrypt | Op::GenerateDataKey | Op::GenerateDataKeyPairForRecipient);
        let public_key = match recipient {
            None if releases_plaintext && policy.require_recipient => {
                return Err(KmsError::AccessDenied(format!(
                    "{} without a Recipient is denied by the key policy of {}",
                    op.name(),
                    key.key_id
                )));
            }
            None => None,
            Some(_) if !releases_plaintext => {
                return Err(KmsError::Validation(format!("{} does not take a Recipient", op.name())));
            }
            Some(recipient) => Some(self.check_recipient(policy, recipient)?),
        };
        Ok((key, public_key))
    }

    /// Verifies the document as KMS does and checks the policy's PCR conditions on it; returns
    /// the document's `public_key`.
    fn check_recipient(&self, policy: &LocalKeyPolicy, recipient: &Recipient) -> Result<Vec<u8>, KmsError> {
        let root_path = &self.trust.root_pem_path;
        let pem = std::fs::read_to_string(root_path).map_err(|e| {
            KmsError::AccessDenied(format!(
                "attestation document: cannot read the trusted root {}: {e} (the development CA appears when the enclave worker first boots)",
                root_path.display()
            ))
        })?;
        let root = TrustAnchor::from_pem(&pem).map_err(|e| {
            KmsError::AccessDenied(format!("attestation document: the trusted root {} is unusable: {e}", root_path.display()))
        })?;
        let mut options = VerifyOptions::new(root, now_ms());
        options.max_age_s = self.trust.max_document_age.as_secs();
        // KMS does not refuse debug-mode documents by itself: the PCR conditions below do
        // (a debug enclave's PCRs are zero).
        options.allow_debug = true;
        let verified = protocol::attestation::verify(&recipient.attestation_document, &options).map_err(|e| {
            KmsError::AccessDenied(format!("attestation document: check `{}` failed: {}", e.check().as_str(), e.reason()))
        })?;
        for (index, want) in &policy.recipient_pcrs {
            match verified.document.pcr(*index) {
                None => {
                    return Err(KmsError::AccessDenied(format!(
                        "PCR{index} is absent from the attestation document ({} is required by the key policy)",
                        condition_key(*index)
                    )));
                }
                Some(got) if got != want.as_slice() => {
                    return Err(KmsError::AccessDenied(format!(
                        "PCR{index} does not match the key policy ({}): the document has {}, the policy requires {}",
                        condition_key(*index),
                        hex::encode(got),
                        hex::encode(want)
                    )));
                }
                Some(_) => {}
            }
        }
        verified
            .document
            .public_key
            .filter(|k| !k.is_empty())
            .ok_or_else(|| KmsError::Validation("the Recipient attestation document carries no public_key".into()))
    }
}

/// What a release returns: `(plaintext, ciphertext_for_recipient)`, exactly one of them.
type Released = (Option<Zeroizing<Vec<u8>>>, Option<Vec<u8>>);

/// Either the plaintext (no Recipient) or the CMS envelope to the recipient's key.
fn deliver(plaintext: Zeroizing<Vec<u8>>, recipient_key: Option<Vec<u8>>) -> Result<Released, KmsError> {
    match recipient_key {
        None => Ok((Some(plaintext), None)),
        Some(spki) => {
            let mut rng = getrandom::rand_core::UnwrapErr(getrandom::SysRng);
            let envelope = protocol::cms::seal(&spki, &plaintext, &mut rng).map_err(|e| {
                KmsError::Validation(format!("the attestation document's public_key is not a usable RSA key: {e}"))
            })?;
            Ok((None, Some(envelope)))
        }
    }
}

impl Kms for LocalKms {
    /// The local endpoint (`kms_endpoint`) authorises by the attestation document alone, as the
    /// key policy does; these credentials only give the request its AWS shape.
    fn enclave_access(&self) -> Result<AwsCredentials, KmsError> {
        Ok(AwsCredentials {
            region: protocol::kms_api::LOCAL_REGION.into(),
            access_key_id: LOCAL_ACCESS_KEY_ID.into(),
            secret_access_key: Zeroizing::new(LOCAL_ACCESS_KEY_ID.into()),
            session_token: None,
        })
    }

    fn encrypt(&self, key_id: &str, plaintext: &[u8], context: &EncryptionContext) -> Result<Vec<u8>, KmsError> {
        if plaintext.is_empty() || plaintext.len() > MAX_ENCRYPT_PLAINTEXT {
            return Err(KmsError::Validation(format!(
                "Encrypt takes 1..={MAX_ENCRYPT_PLAINTEXT} bytes of plaintext, not {}",
                plaintext.len()
            )));
        }
        let (key, _) = self.authorize(key_id, Op::Encrypt, context, None)?;
        blob::seal(&key.key_id, &key.material, plaintext, context)
    }

    fn generate_data_key(
        &self,
        key_id: &str,
        context: &EncryptionContext,
        recipient: Option<&Recipient>,
    ) -> Result<DataKey, KmsError> {
        let (key, recipient_key) = self.authorize(key_id, Op::GenerateDataKey, context, recipient)?;
        let data_key = Zeroizing::new(random::<DATA_KEY_LEN>()?.to_vec());
        let ciphertext_blob = blob::seal(&key.key_id, &key.material, &data_key, context)?;
        let (plaintext, ciphertext_for_recipient) = deliver(data_key, recipient_key)?;
        Ok(DataKey { key_id: key.key_id, ciphertext_blob, plaintext, ciphertext_for_recipient })
    }

    fn generate_data_key_pair_without_plaintext(
        &self,
        key_id: &str,
        context: &EncryptionContext,
    ) -> Result<DataKeyPair, KmsError> {
        use p256::pkcs8::{EncodePrivateKey, EncodePublicKey};
        let (key, _) = self.authorize(key_id, Op::GenerateDataKeyPair, context, None)?;
        let secret = p256_secret()?;
        let pkcs8 = secret.to_pkcs8_der().map_err(|e| KmsError::Unavailable(format!("PKCS#8 encoding: {e}")))?;
        let spki = secret
            .public_key()
            .to_public_key_der()
            .map_err(|e| KmsError::Unavailable(format!("SPKI encoding: {e}")))?;
        let private_key_ciphertext_blob = blob::seal(&key.key_id, &key.material, pkcs8.as_bytes(), context)?;
        Ok(DataKeyPair { key_id: key.key_id, public_key_der: spki.as_bytes().to_vec(), private_key_ciphertext_blob })
    }

    fn decrypt(
        &self,
        key_id: Option<&str>,
        ciphertext_blob: &[u8],
        context: &EncryptionContext,
        recipient: Option<&Recipient>,
    ) -> Result<Decrypted, KmsError> {
        let parsed = blob::Blob::parse(ciphertext_blob)?;
        let key = self.load(parsed.key_id)?;
        if let Some(named) = key_id {
            let named = self.resolve(named)?;
            if named != key.key_id {
                return Err(KmsError::InvalidCiphertext(format!(
                    "the ciphertext was encrypted under {}, not under {named}",
                    key.key_id
                )));
            }
        }
        // Authorization first: nothing is decrypted for a caller the policy refuses.
        let (key, recipient_key) = self.authorize_loaded(key, Op::Decrypt, context, recipient)?;
        let plaintext = parsed.open(&key.material, context)?;
        let (plaintext, ciphertext_for_recipient) = deliver(plaintext, recipient_key)?;
        Ok(Decrypted { key_id: key.key_id, plaintext, ciphertext_for_recipient })
    }

    fn generate_data_key_pair_for_recipient(
        &self,
        key_id: &str,
        context: &EncryptionContext,
        recipient: &Recipient,
    ) -> Result<DataKeyPairForRecipient, KmsError> {
        use p256::pkcs8::{EncodePrivateKey, EncodePublicKey};
        let (key, recipient_key) = self.authorize(key_id, Op::GenerateDataKeyPairForRecipient, context, Some(recipient))?;
        let secret = p256_secret()?;
        let pkcs8 = Zeroizing::new(
            secret.to_pkcs8_der().map_err(|e| KmsError::Unavailable(format!("PKCS#8 encoding: {e}")))?.as_bytes().to_vec(),
        );
        let spki = secret.public_key().to_public_key_der().map_err(|e| KmsError::Unavailable(format!("SPKI encoding: {e}")))?;
        let private_key_ciphertext_blob = blob::seal(&key.key_id, &key.material, &pkcs8, context)?;
        let (_, envelope) = deliver(pkcs8, recipient_key)?;
        let ciphertext_for_recipient =
            envelope.ok_or_else(|| KmsError::Unavailable("no envelope for the recipient".into()))?;
        Ok(DataKeyPairForRecipient {
            key_id: key.key_id,
            public_key_der: spki.as_bytes().to_vec(),
            private_key_ciphertext_blob,
            ciphertext_for_recipient,
        })
    }

    fn key_evidence(&self, key_id: &str) -> Result<KeyEvidence, KmsError> {
        let key = self.load(key_id)?;
        let grants = self.grants(&key.key_id)?;
        Ok(KeyEvidence {
            metadata: KeyMetadata {
                arn: key.key_id.clone(),
                key_state: if key.enabled { "Enabled" } else { "Disabled" }.into(),
                enabled: key.enabled,
                origin: "AWS_KMS".into(),
                key_spec: "SYMMETRIC_DEFAULT".into(),
                key_usage: "ENCRYPT_DECRYPT".into(),
                multi_region: false,
            },
            policy: key.policy.to_iam_policy().to_string(),
            grants: grants
                .into_iter()
                .map(|(grant_id, grantee_principal, operations)| GrantSummary { grant_id, grantee_principal, operations })
                .collect(),
            grants_truncated: false,
        })
    }

    fn describe_key(&self, key_id: &str) -> Result<KeyDescription, KmsError> {
        let key = self.load(key_id)?;
        Ok(KeyDescription {
            policy: key.policy.to_iam_policy().to_string(),
            arn: key.key_id,
            origin: "AWS_KMS".into(),
            key_spec: "SYMMETRIC_DEFAULT".into(),
            key_usage: "ENCRYPT_DECRYPT".into(),
            enabled: key.enabled,
            multi_region: false,
        })
    }
}

fn grants_in(conn: &Connection, key_id: &str) -> rusqlite::Result<Vec<(String, String, Vec<String>)>> {
    let mut stmt = conn.prepare("SELECT grant_id, grantee, operations FROM grants WHERE key_id = ?1 ORDER BY created_ms, grant_id")?;
    let rows = stmt.query_map([key_id], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?)))?;
    rows.map(|row| row.map(|(id, grantee, ops)| (id, grantee, serde_json::from_str(&ops).unwrap_or_default()))).collect()
}

/// Key id, key ARN, alias name or alias ARN → key ARN, if it exists.
fn resolve_in(conn: &Connection, name: &str) -> rusqlite::Result<Option<String>> {
    let name = name.strip_prefix(ALIAS_ARN_PREFIX).filter(|n| n.starts_with("alias/")).unwrap_or(name);
    if name.starts_with("alias/") {
        return conn.query_row("SELECT key_id FROM aliases WHERE alias = ?1", [name], |r| r.get(0)).optional();
    }
    let arn = if name.starts_with(KEY_ARN_PREFIX) { name.to_owned() } else { format!("{KEY_ARN_PREFIX}{name}") };
    conn.query_row("SELECT key_id FROM keys WHERE key_id = ?1", [&arn], |r| r.get(0)).optional()
}

fn db_ms(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

fn db_error(path: &Path, e: rusqlite::Error) -> KmsError {
    KmsError::Unavailable(format!("key database {}: {e}", path.display()))
}

fn random<const N: usize>() -> Result<[u8; N], KmsError> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| KmsError::Unavailable(format!("random number generator: {e}")))?;
    Ok(bytes)
}

fn random_hex<const N: usize>() -> Result<String, KmsError> {
    Ok(hex::encode(random::<N>()?))
}

fn p256_secret() -> Result<p256::SecretKey, KmsError> {
    // A uniformly random scalar: retry the (astronomically rare) out-of-range draw.
    for _ in 0..16 {
        let bytes = Zeroizing::new(random::<32>()?);
        if let Ok(key) = p256::SecretKey::from_slice(&bytes[..]) {
            return Ok(key);
        }
    }
    Err(KmsError::Unavailable("no valid P-256 scalar in 16 draws".into()))
}

#[cfg(test)]
mod tests;
