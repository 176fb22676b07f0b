//! Trust anchors: the compiled-in AWS Nitro Enclaves root G1, and any other root a caller pins
//! (a development root, or a root named in a policy file).

use sha2::{Digest, Sha256};

use super::error::CertRole;
use super::x509;

/// AWS Nitro Enclaves Root G1 (`C=US, O=Amazon, OU=AWS, CN=aws.nitro-enclaves`, P-384,
/// valid 2019-10-28 → 2049-10-28), as AWS publishes it in `AWS_NitroEnclaves_Root-G1.zip`
/// ("Verifying the root of trust" in the Nitro Enclaves user guide). Public data.
pub const AWS_NITRO_ROOT_G1_PEM: &str = concat!(
    "-----BEGIN CERTIFICATE-----\n",
    "MIICETCCAZagAwIBAgIRAPkxdWgbkK/hHUbMtOTn+FYwCgYIKoZIzj0EAwMwSTEL\n",
    "MAkGA1UEBhMCVVMxDzANBgNVBAoMBkFtYXpvbjEMMAoGA1UECwwDQVdTMRswGQYD\n",
    "VQQDDBJhd3Mubml0cm8tZW5jbGF2ZXMwHhcNMTkxMDI4MTMyODA1WhcNNDkxMDI4\n",
    "MTQyODA1WjBJMQswCQYDVQQGEwJVUzEPMA0GA1UECgwGQW1hem9uMQwwCgYDVQQL\n",
    "DANBV1MxGzAZBgNVBAMMEmF3cy5uaXRyby1lbmNsYXZlczB2MBAGByqGSM49AgEG\n",
    "BSuBBAAiA2IABPwCVOumCMHzaHDimtqQvkY4MpJzbolL//Zy2YlES1BR5TSksfbb\n",
    "48C8WBoyt7F2Bw7eEtaaP+ohG2bnUs990d0JX28TcPQXCEPZ3BABIeTPYwEoCWZE\n",
    "h8l5YoQwTcU/9KNCMEAwDwYDVR0TAQH/BAUwAwEB/zAdBgNVHQ4EFgQUkCW1DdkF\n",
    "R+eWw5b6cp3PmanfS5YwDgYDVR0PAQH/BAQDAgGGMAoGCCqGSM49BAMDA2kAMGYC\n",
    "MQCjfy+Rocm9Xue4YnwWmNJVA44fA0P5W2OpYow9OYCVRaEevL8uO1XYru5xtMPW\n",
    "rfMCMQCi85sWBbJwKKXdS6BptQFuZbT73o/gBh1qUxl/nNr12UO8Yfwr6wPLb+6N\n",
    "IwLz3/Y=\n",
    "-----END CERTIFICATE-----"
);

/// The DER of [`AWS_NITRO_ROOT_G1_PEM`].
pub const AWS_NITRO_ROOT_G1_DER: [u8; 533] = [
    0x30, 0x82, 0x02, 0x11, 0x30, 0x82, 0x01, 0x96, 0xa0, 0x03, 0x02, 0x01, 0x02, 0x02, 0x11, 0x00,
    0xf9, 0x31, 0x75, 0x68, 0x1b, 0x90, 0xaf, 0xe1, 0x1d, 0x46, 0xcc, 0xb4, 0xe4, 0xe7, 0xf8, 0x56,
    0x30, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03, 0x30, 0x49, 0x31, 0x0b,
    0x30, 0x09, 0x06, 0x03, 0x55, 0x04, 0x06, 0x13, 0x02, 0x55, 0x53, 0x31, 0x0f, 0x30, 0x0d, 0x06,
    0x03, 0x55, 0x04, 0x0a, 0x0c, 0x06, 0x41, 0x6d, 0x61, 0x7a, 0x6f, 0x6e, 0x31, 0x0c, 0x30, 0x0a,
    0x06, 0x03, 0x55, 0x04, 0x0b, 0x0c, 0x03, 0x41, 0x57, 0x53, 0x31, 0x1b, 0x30, 0x19, 0x06, 0x03,
    0x55, 0x04, 0x03, 0x0c, 0x12, 0x61, 0x77, 0x73, 0x2e, 0x6e, 0x69, 0x74, 0x72, 0x6f, 0x2d, 0x65,
    0x6e, 0x63, 0x6c, 0x61, 0x76, 0x65, 0x73, 0x30, 0x1e, 0x17, 0x0d, 0x31, 0x39, 0x31, 0x30, 0x32,
    0x38, 0x31, 0x33, 0x32, 0x38, 0x30, 0x35, 0x5a, 0x17, 0x0d, 0x34, 0x39, 0x31, 0x30, 0x32, 0x38,
    0x31, 0x34, 0x32, 0x38, 0x30, 0x35, 0x5a, 0x30, 0x49, 0x31, 0x0b, 0x30, 0x09, 0x06, 0x03, 0x55,
    0x04, 0x06, 0x13, 0x02, 0x55, 0x53, 0x31, 0x0f, 0x30, 0x0d, 0x06, 0x03, 0x55, 0x04, 0x0a, 0x0c,
    0x06, 0x41, 0x6d, 0x61, 0x7a, 0x6f, 0x6e, 0x31, 0x0c, 0x30, 0x0a, 0x06, 0x03, 0x55, 0x04, 0x0b,
    0x0c, 0x03, 0x41, 0x57, 0x53, 0x31, 0x1b, 0x30, 0x19, 0x06, 0x03, 0x55, 0x04, 0x03, 0x0c, 0x12,
    0x61, 0x77, 0x73, 0x2e, 0x6e, 0x69, 0x74, 0x72, 0x6f, 0x2d, 0x65, 0x6e, 0x63, 0x6c, 0x61, 0x76,
    0x65, 0x73, 0x30, 0x76, 0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06,
    0x05, 0x2b, 0x81, 0x04, 0x00, 0x22, 0x03, 0x62, 0x00, 0x04, 0xfc, 0x02, 0x54, 0xeb, 0xa6, 0x08,
    0xc1, 0xf3, 0x68, 0x70, 0xe2, 0x9a, 0xda, 0x90, 0xbe, 0x46, 0x38, 0x32, 0x92, 0x73, 0x6e, 0x89,
    0x4b, 0xff, 0xf6, 0x72, 0xd9, 0x89, 0x44, 0x4b, 0x50, 0x51, 0xe5, 0x34, 0xa4, 0xb1, 0xf6, 0xdb,
    0xe3, 0xc0, 0xbc, 0x58, 0x1a, 0x32, 0xb7, 0xb1, 0x76, 0x07, 0x0e, 0xde, 0x12, 0xd6, 0x9a, 0x3f,
    0xea, 0x21, 0x1b, 0x66, 0xe7, 0x52, 0xcf, 0x7d, 0xd1, 0xdd, 0x09, 0x5f, 0x6f, 0x13, 0x70, 0xf4,
    0x17, 0x08, 0x43, 0xd9, 0xdc, 0x10, 0x01, 0x21, 0xe4, 0xcf, 0x63, 0x01, 0x28, 0x09, 0x66, 0x44,
    0x87, 0xc9, 0x79, 0x62, 0x84, 0x30, 0x4d, 0xc5, 0x3f, 0xf4, 0xa3, 0x42, 0x30, 0x40, 0x30, 0x0f,
    0x06, 0x03, 0x55, 0x1d, 0x13, 0x01, 0x01, 0xff, 0x04, 0x05, 0x30, 0x03, 0x01, 0x01, 0xff, 0x30,
    0x1d, 0x06, 0x03, 0x55, 0x1d, 0x0e, 0x04, 0x16, 0x04, 0x14, 0x90, 0x25, 0xb5, 0x0d, 0xd9, 0x05,
    0x47, 0xe7, 0x96, 0xc3, 0x96, 0xfa, 0x72, 0x9d, 0xcf, 0x99, 0xa9, 0xdf, 0x4b, 0x96, 0x30, 0x0e,
    0x06, 0x03, 0x55, 0x1d, 0x0f, 0x01, 0x01, 0xff, 0x04, 0x04, 0x03, 0x02, 0x01, 0x86, 0x30, 0x0a,
    0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03, 0x03, 0x69, 0x00, 0x30, 0x66, 0x02,
    0x31, 0x00, 0xa3, 0x7f, 0x2f, 0x91, 0xa1, 0xc9, 0xbd, 0x5e, 0xe7, 0xb8, 0x62, 0x7c, 0x16, 0x98,
    0xd2, 0x55, 0x03, 0x8e, 0x1f, 0x03, 0x43, 0xf9, 0x5b, 0x63, 0xa9, 0x62, 0x8c, 0x3d, 0x39, 0x80,
    0x95, 0x45, 0xa1, 0x1e, 0xbc, 0xbf, 0x2e, 0x3b, 0x55, 0xd8, 0xae, 0xee, 0x71, 0xb4, 0xc3, 0xd6,
    0xad, 0xf3, 0x02, 0x31, 0x00, 0xa2, 0xf3, 0x9b, 0x16, 0x05, 0xb2, 0x70, 0x28, 0xa5, 0xdd, 0x4b,
    0xa0, 0x69, 0xb5, 0x01, 0x6e, 0x65, 0xb4, 0xfb, 0xde, 0x8f, 0xe0, 0x06, 0x1d, 0x6a, 0x53, 0x19,
    0x7f, 0x9c, 0xda, 0xf5, 0xd9, 0x43, 0xbc, 0x61, 0xfc, 0x2b, 0xeb, 0x03, 0xcb, 0x6f, 0xee, 0x8d,
    0x23, 0x02, 0xf3, 0xdf, 0xf6,
];

/// SHA-256 of [`AWS_NITRO_ROOT_G1_DER`], as AWS publishes it.
pub const AWS_NITRO_ROOT_G1_SHA256: &str = "641a0321a3e244efe456463195d606317ed7cdcc3c1756e09893f3c68f79bb5b";

/// Name a policy file uses for the AWS root.
pub const AWS_NITRO_ROOT_G1_NAME: &str = "aws-nitro-g1";

/// Subject organizational unit that marks an ephem-batch development root.
pub const DEVELOPMENT_ROOT_MARKER: &str = "ephem-batch development";

/// What kind of root a trust anchor is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RootKind {
    /// Byte-identical to the compiled-in AWS Nitro Enclaves root G1.
    AwsNitroG1,
    /// A root made by ephem-batch's development issuer: documents under it prove nothing about
    /// Nitro hardware.
    Development,
    /// Any other root a caller chose to pin.
    Other,
}

impl RootKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RootKind::AwsNitroG1 => "aws-nitro-g1",
            RootKind::Development => "development",
            RootKind::Other => "other",
        }
    }
}

/// Why a root certificate cannot be pinned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TrustAnchorError {
    #[error("root PEM does not decode: {0}")]
    Pem(String),
    #[error("root PEM label is {0:?}, not \"CERTIFICATE\"")]
    PemLabel(String),
    #[error("{0}")]
    Certificate(String),
    #[error("root key: {0}")]
    Key(super::error::KeyError),
}

/// A pinned root: `cabundle[0]` must be byte-identical to `der`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustAnchor {
    der: Vec<u8>,
    subject: String,
    kind: RootKind,
}

impl TrustAnchor {
    /// The compiled-in AWS Nitro Enclaves root G1.
    pub fn aws_nitro_g1() -> TrustAnchor {
        TrustAnchor {
            der: AWS_NITRO_ROOT_G1_DER.to_vec(),
            subject: "CN=aws.nitro-enclaves,OU=AWS,O=Amazon,C=US".to_owned(),
            kind: RootKind::AwsNitroG1,
        }
    }

    /// Pins a root given as DER. It must be a P-384 certificate; its kind is derived from its
    /// bytes (AWS root) or subject (development root).
    pub fn from_der(der: &[u8]) -> Result<TrustAnchor, TrustAnchorError> {
        if der == AWS_NITRO_ROOT_G1_DER {
            return Ok(TrustAnchor::aws_nitro_g1());
        }
        let cert = x509::parse(der, CertRole::Bundle(0)).map_err(|e| TrustAnchorError::Certificate(e.to_string()))?;
        x509::p384_key(&cert.cert).map_err(TrustAnchorError::Key)?;
        let subject = cert.subject();
        let development = cert
            .cert
            .tbs_certificate()
            .subject()
            .organization_unit()
            .ok()
            .flatten()
            .is_some_and(|ou| ou.value() == DEVELOPMENT_ROOT_MARKER);
        Ok(TrustAnchor {
            der: der.to_vec(),
            subject,
            kind: if development { RootKind::Development } else { RootKind::Other },
        })
    }

    /// Pins a root given as one PEM `CERTIFICATE` block.
    pub fn from_pem(pem: &str) -> Result<TrustAnchor, TrustAnchorError> {
        let (label, der) =
            der::pem::decode_vec(pem.trim().as_bytes()).map_err(|e| TrustAnchorError::Pem(e.to_string()))?;
        if label != "CERTIFICATE" {
            return Err(TrustAnchorError::PemLabel(label.to_owned()));
        }
        TrustAnchor::from_der(&der)
    }

    pub fn der(&self) -> &[u8] {
        &self.der
    }

    /// The root as a PEM block (64-column lines, LF).
    pub fn to_pem(&self) -> String {
        der::pem::encode_string("CERTIFICATE", der::pem::LineEnding::LF, &self.der).unwrap_or_default()
    }

    pub fn kind(&self) -> RootKind {
        self.kind
    }

    /// Subject in RFC 4514 form.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// SHA-256 of the DER.
    pub fn sha256(&self) -> [u8; 32] {
        Sha256::digest(&self.der).into()
    }

    /// A short label for messages: `aws-nitro-g1`, or `development root <CN> (sha256 …)`.
    pub fn label(&self) -> String {
        match self.kind {
            RootKind::AwsNitroG1 => AWS_NITRO_ROOT_G1_NAME.to_owned(),
            RootKind::Development => format!("development root {} (sha256 {})", self.subject, hex::encode(self.sha256())),
            RootKind::Other => format!("root {} (sha256 {})", self.subject, hex::encode(self.sha256())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aws_root_constants_agree() {
        let (label, der) = der::pem::decode_vec(AWS_NITRO_ROOT_G1_PEM.as_bytes()).unwrap();
        assert_eq!(label, "CERTIFICATE");
        assert_eq!(der, AWS_NITRO_ROOT_G1_DER);
        assert_eq!(hex::encode(Sha256::digest(AWS_NITRO_ROOT_G1_DER)), AWS_NITRO_ROOT_G1_SHA256);
        assert_eq!(
            AWS_NITRO_ROOT_G1_SHA256.to_uppercase(),
            "641A0321A3E244EFE456463195D606317ED7CDCC3C1756E09893F3C68F79BB5B"
        );
        let anchor = TrustAnchor::from_pem(AWS_NITRO_ROOT_G1_PEM).unwrap();
        assert_eq!(anchor, TrustAnchor::aws_nitro_g1());
        assert_eq!(anchor.kind(), RootKind::AwsNitroG1);
        // The subject string we hard-code is what the certificate says.
        let cert = x509::parse(&AWS_NITRO_ROOT_G1_DER, CertRole::Bundle(0)).unwrap();
        assert_eq!(cert.subject(), anchor.subject());
        assert_eq!(cert.not_after_ms(), 2519044085000);
        // PEM re-encoding gives back the published text (modulo the final newline).
        assert_eq!(anchor.to_pem().trim_end(), AWS_NITRO_ROOT_G1_PEM);
    }

    #[test]
    fn rejects_non_certificates() {
        assert!(matches!(TrustAnchor::from_pem("nonsense"), Err(TrustAnchorError::Pem(_))));
        let key_pem = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n";
        assert!(matches!(TrustAnchor::from_pem(key_pem), Err(TrustAnchorError::PemLabel(_))));
        assert!(matches!(TrustAnchor::from_der(&[0x30, 0x00]), Err(TrustAnchorError::Certificate(_))));
    }
}
