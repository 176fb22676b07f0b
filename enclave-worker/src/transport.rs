//! Where the worker listens: vsock in an enclave (feature `nitro`), a Unix or TCP socket on
//! loopback for the embedded default. The frames are the same on all of them.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};

/// A connected byte stream.
pub trait Connection: Read + Write + Send {}
impl<T: Read + Write + Send> Connection for T {}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Unix(std::path::PathBuf),
    Tcp(String),
    #[cfg(feature = "nitro")]
    Vsock { cid: u32, port: u32 },
}

impl Endpoint {
    /// `unix:PATH`, `tcp:HOST:PORT`, or (feature `nitro`) `vsock:PORT` / `vsock:CID:PORT`.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            return Ok(Endpoint::Unix(path.into()));
        }
        if let Some(address) = text.strip_prefix("tcp:") {
            return Ok(Endpoint::Tcp(address.to_owned()));
        }
        #[cfg(feature = "nitro")]
        if let Some(rest) = text.strip_prefix("vsock:") {
            let parts: Vec<&str> = rest.split(':').collect();
            let number = |s: &str| s.parse::<u32>().map_err(|_| format!("bad vsock number {s:?}"));
            return match parts.as_slice() {
                [port] => Ok(Endpoint::Vsock { cid: u32::MAX, port: number(port)? }),
                [cid, port] => Ok(Endpoint::Vsock { cid: number(cid)?, port: number(port)? }),
                _ => Err(format!("bad vsock endpoint {text:?}")),
            };
        }
        Err(format!("unknown endpoint {text:?} (expected unix:PATH or tcp:HOST:PORT)"))
    }

    /// Opens a connection to this endpoint (the host side).
    pub fn connect(&self) -> std::io::Result<Box<dyn Connection>> {
        match self {
            Endpoint::Unix(path) => Ok(Box::new(UnixStream::connect(path)?)),
            Endpoint::Tcp(address) => {
                let stream = TcpStream::connect(address)?;
                stream.set_nodelay(true)?;
                Ok(Box::new(stream))
            }
            #[cfg(feature = "nitro")]
            Endpoint::Vsock { cid, port } => Ok(Box::new(vsock::VsockStream::connect_with_cid_port(*cid, *port)?)),
        }
    }
}

pub enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
    #[cfg(feature = "nitro")]
    Vsock(vsock::VsockListener),
}

impl Listener {
    pub fn bind(endpoint: &Endpoint) -> std::io::Result<Self> {
        match endpoint {
            Endpoint::Unix(path) => {
                // A stale socket file from an earlier run would make bind fail.
                if path.exists() {
                    std::fs::remove_file(path)?;
                }
                Ok(Listener::Unix(UnixListener::bind(path)?))
            }
            Endpoint::Tcp(address) => Ok(Listener::Tcp(TcpListener::bind(address)?)),
            #[cfg(feature = "nitro")]
            Endpoint::Vsock { cid, port } => {
                Ok(Listener::Vsock(vsock::VsockListener::bind(&vsock::VsockAddr::new(*cid, *port))?))
            }
        }
    }

    pub fn accept(&self) -> std::io::Result<Box<dyn Connection>> {
        match self {
            Listener::Unix(listener) => Ok(Box::new(listener.accept()?.0)),
            Listener::Tcp(listener) => {
                let (stream, _) = listener.accept()?;
                stream.set_nodelay(true)?;
                Ok(Box::new(stream))
            }
            #[cfg(feature = "nitro")]
            Listener::Vsock(listener) => Ok(Box::new(listener.accept()?.0)),
        }
    }
}
