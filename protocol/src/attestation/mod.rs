//! Nitro attestation documents: parsing, verification, policy, development issuer.
