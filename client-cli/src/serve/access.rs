//! Who may use `serve`: its owner only. The proxy spends the owner's identity (usage is
//! accounted to its label) and answers in plaintext, so three checks come before anything
//! else:
//!
//! - `Host` must be this listener's own loopback name and port (`127.0.0.1:<port>`,
//!   `localhost:<port>`, `[::1]:<port>`): a web page that rebinds its DNS name to 127.0.0.1
//!   still sends its own name, and is refused.
//! - No `Origin` at all: a browser adds one to every cross-origin request (and to every
//!   `POST` of `fetch`), an application never needs one.
//! - When the home holds a token (`serve --require-token` writes it, mode 0600), an
//!   `Authorization: Bearer <token>` carrying it: other users of a shared machine reach the
//!   loopback port, not the owner's home.

use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hyper::header::{AUTHORIZATION, HOST, ORIGIN};
use hyper::HeaderMap;
use sha2::{Digest, Sha256};

/// The token file, in the home's client directory.
pub const TOKEN_FILE: &str = "serve.token";

/// Why a request was refused before it was read; [`Refused::check`] names it in the answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the request has no Host header")]
    MissingHost,
    #[error("Host {0:?} is not this proxy's loopback address (DNS rebinding?)")]
    ForeignHost(String),
    #[error("requests with an Origin header (from a web page) are refused")]
    Origin,
    #[error("this proxy requires its bearer token (Authorization: Bearer, from the home's {TOKEN_FILE})")]
    MissingToken,
    #[error("the bearer token is not this proxy's")]
    WrongToken,
}

impl Refused {
    /// The `code` of the OpenAI-shaped error.
    pub fn check(&self) -> &'static str {
        match self {
            Self::MissingHost | Self::ForeignHost(_) => "host",
            Self::Origin => "origin",
            Self::MissingToken | Self::WrongToken => "token",
        }
    }

    /// 401 for a token (the caller may retry with one), 403 for the rest.
    pub fn status(&self) -> u16 {
        match self {
            Self::MissingToken | Self::WrongToken => 401,
            _ => 403,
        }
    }
}

/// What a request must show.
#[derive(Clone)]
pub struct Access {
    port: u16,
    /// SHA-256 of the token, if one is required (compared digest to digest: no timing on the
    /// token's bytes).
    token: Option<[u8; 32]>,
}

impl Access {
    pub fn new(port: u16, token: Option<&str>) -> Self {
        Self { port, token: token.map(digest) }
    }

    /// Admits the request or names the check it failed.
    pub fn admit(&self, headers: &HeaderMap) -> Result<(), Refused> {
        let host = headers.get(HOST).ok_or(Refused::MissingHost)?;
        let host = host.to_str().map_err(|_| Refused::ForeignHost(String::from_utf8_lossy(host.as_bytes()).into_owned()))?;
        if !self.is_own_host(host) {
            return Err(Refused::ForeignHost(host.to_owned()));
        }
        if headers.contains_key(ORIGIN) {
            return Err(Refused::Origin);
        }
        if let Some(want) = &self.token {
            let given = headers.get(AUTHORIZATION).ok_or(Refused::MissingToken)?;
            let given = given.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")).ok_or(Refused::MissingToken)?;
            if digest(given.trim()) != *want {
                return Err(Refused::WrongToken);
            }
        }
        Ok(())
    }

    fn is_own_host(&self, host: &str) -> bool {
        let Some((name, port)) = host.rsplit_once(':') else { return false };
        port.parse::<u16>().is_ok_and(|p| p == self.port)
            && (name == "127.0.0.1" || name.eq_ignore_ascii_case("localhost") || name == "[::1]")
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Why the token file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path} is readable by other users (mode {mode:03o}); it must be 0600")]
    Permissions { path: PathBuf, mode: u32 },
    #[error("{path} holds no token")]
    Empty { path: PathBuf },
}

/// The token in `path`, if the file exists (then it is required), after checking that only
/// the owner can read it.
pub fn read_token(path: &Path) -> Result<Option<String>, TokenError> {
    let io = |source| TokenError::Io { path: path.to_path_buf(), source };
    let mode = match fs::metadata(path) {
        Ok(m) => m.permissions().mode() & 0o777,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    if mode & 0o077 != 0 {
        return Err(TokenError::Permissions { path: path.to_path_buf(), mode });
    }
    let token = fs::read_to_string(path).map_err(io)?.trim().to_owned();
    if token.is_empty() {
        return Err(TokenError::Empty { path: path.to_path_buf() });
    }
    Ok(Some(token))
}

/// The token in `path`, created (32 random bytes, hex, mode 0600, create-only) if there is none.
pub fn ensure_token(path: &Path) -> Result<String, TokenError> {
    if let Some(token) = read_token(path)? {
        return Ok(token);
    }
    let io = |source| TokenError::Io { path: path.to_path_buf(), source };
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| io(io::Error::other(e.to_string())))?;
    let token = hex::encode(bytes);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(io)?;
    }
    match fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(mut f) => f.write_all(format!("{token}\n").as_bytes()).and_then(|()| f.sync_all()).map_err(io)?,
        // Another `serve` of this home wrote it first: use that one.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(e)),
    }
    read_token(path)?.ok_or_else(|| io(io::ErrorKind::NotFound.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, HeaderValue::from_str(value).unwrap());
        }
        h
    }

    #[test]
    fn only_this_listeners_loopback_names_are_admitted() {
        let access = Access::new(8089, None);
        for host in ["127.0.0.1:8089", "localhost:8089", "LocalHost:8089", "[::1]:8089"] {
            assert_eq!(access.admit(&headers(&[("host", host)])), Ok(()), "{host}");
        }
        for host in ["evil.example:8089", "127.0.0.1", "127.0.0.1:8090", "localhost.evil.example:8089", "127.0.0.2:8089", "0.0.0.0:8089"] {
            assert_eq!(access.admit(&headers(&[("host", host)])), Err(Refused::ForeignHost(host.into())), "{host}");
        }
        assert_eq!(access.admit(&headers(&[])), Err(Refused::MissingHost));
    }

    #[test]
    fn any_origin_is_refused() {
        let access = Access::new(8089, None);
        for origin in ["http://127.0.0.1:8089", "null", "https://evil.example"] {
            let refused = access.admit(&headers(&[("host", "127.0.0.1:8089"), ("origin", origin)]));
            assert_eq!(refused, Err(Refused::Origin), "{origin}");
            assert_eq!(refused.unwrap_err().status(), 403);
        }
    }

    #[test]
    fn a_set_token_is_required() {
        let access = Access::new(8089, Some("s3cret"));
        let host = ("host", "127.0.0.1:8089");
        assert_eq!(access.admit(&headers(&[host])), Err(Refused::MissingToken));
        assert_eq!(access.admit(&headers(&[host, ("authorization", "Basic czNjcmV0")])), Err(Refused::MissingToken));
        assert_eq!(access.admit(&headers(&[host, ("authorization", "Bearer guess")])), Err(Refused::WrongToken));
        assert_eq!(access.admit(&headers(&[host, ("authorization", "Bearer s3cret")])), Ok(()));
    }

    #[test]
    fn the_token_file_is_the_owners_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("client").join(TOKEN_FILE);
        assert_eq!(read_token(&path).unwrap(), None);
        let token = ensure_token(&path).unwrap();
        assert_eq!(token.len(), 64);
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(ensure_token(&path).unwrap(), token, "kept, not replaced");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(read_token(&path), Err(TokenError::Permissions { mode: 0o644, .. })));
    }
}
