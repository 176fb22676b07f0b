//! The connection to the enclave worker: vsock to a Nitro enclave (feature `nitro`), a Unix or
//! TCP socket on loopback for the embedded default. The frames are the same on all of them, and
//! every connection opens with the host's `Hello` and the worker's answering `Hello`.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use protocol::frame::{self, Channel, FrameIoError, Message, Role};

/// Where the worker listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerEndpoint {
    Unix(PathBuf),
    /// `HOST:PORT`.
    Tcp(String),
    #[cfg(feature = "nitro")]
    Vsock { cid: u32, port: u32 },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("worker endpoint {text:?}: {reason}")]
pub struct EndpointError {
    pub text: String,
    pub reason: &'static str,
}

impl WorkerEndpoint {
    /// `unix:PATH`, `tcp:HOST:PORT`, or (feature `nitro`) `vsock:CID:PORT`.
    pub fn parse(text: &str) -> Result<Self, EndpointError> {
        let error = |reason| EndpointError { text: text.to_owned(), reason };
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(error("empty socket path"));
            }
            return Ok(WorkerEndpoint::Unix(path.into()));
        }
        if let Some(address) = text.strip_prefix("tcp:") {
            if !address.contains(':') {
                return Err(error("expected tcp:HOST:PORT"));
            }
            return Ok(WorkerEndpoint::Tcp(address.to_owned()));
        }
        if let Some(rest) = text.strip_prefix("vsock:") {
            #[cfg(feature = "nitro")]
            {
                let (cid, port) = rest.split_once(':').ok_or_else(|| error("expected vsock:CID:PORT"))?;
                let cid = cid.parse().map_err(|_| error("the vsock CID is not a number"))?;
                let port = port.parse().map_err(|_| error("the vsock port is not a number"))?;
                return Ok(WorkerEndpoint::Vsock { cid, port });
            }
            #[cfg(not(feature = "nitro"))]
            {
                let _ = rest;
                return Err(error("vsock needs a build with feature `nitro`"));
            }
        }
        Err(error("expected unix:PATH, tcp:HOST:PORT or vsock:CID:PORT"))
    }

    /// Connects and exchanges `Hello` for `channel`.
    pub fn connect(&self, channel: Channel) -> Result<WorkerLink, LinkError> {
        self.connect_within(channel, None)
    }

    /// [`connect`](Self::connect) whose `Hello` exchange gives up after `timeout` (a worker that
    /// accepts and says nothing must not hold the caller); the timeouts stay set on the link.
    pub fn connect_within(&self, channel: Channel, timeout: Option<Duration>) -> Result<WorkerLink, LinkError> {
        let connect_error = |source| LinkError::Connect { endpoint: self.to_string(), source };
        let stream = match self {
            WorkerEndpoint::Unix(path) => Stream::Unix(UnixStream::connect(path).map_err(connect_error)?),
            WorkerEndpoint::Tcp(address) => {
                let stream = TcpStream::connect(address).map_err(connect_error)?;
                stream.set_nodelay(true).map_err(connect_error)?;
                Stream::Tcp(stream)
            }
            #[cfg(feature = "nitro")]
            WorkerEndpoint::Vsock { cid, port } => {
                Stream::Vsock(vsock::VsockStream::connect_with_cid_port(*cid, *port).map_err(connect_error)?)
            }
        };
        let mut link = WorkerLink { stream };
        if timeout.is_some() {
            let timeouts = link.set_read_timeout(timeout).and_then(|()| link.set_write_timeout(timeout));
            timeouts.map_err(connect_error)?;
        }
        link.send(&Message::Hello { role: Role::Host, channel })?;
        match link.recv()? {
            Message::Hello { role: Role::Enclave, channel: answered } if answered == channel => Ok(link),
            other => Err(LinkError::Handshake { endpoint: self.to_string(), answer: describe(&other) }),
        }
    }
}

impl fmt::Display for WorkerEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerEndpoint::Unix(path) => write!(f, "unix:{}", path.display()),
            WorkerEndpoint::Tcp(address) => write!(f, "tcp:{address}"),
            #[cfg(feature = "nitro")]
            WorkerEndpoint::Vsock { cid, port } => write!(f, "vsock:{cid}:{port}"),
        }
    }
}

impl std::str::FromStr for WorkerEndpoint {
    type Err = EndpointError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("cannot connect to the worker at {endpoint}: {source}")]
    Connect {
        endpoint: String,
        #[source]
        source: io::Error,
    },
    #[error("the worker at {endpoint} answered {answer} instead of Hello")]
    Handshake { endpoint: String, answer: &'static str },
    #[error("connection to the worker: {0}")]
    Frame(#[from] FrameIoError),
    #[error("the worker closed the connection")]
    Closed,
}

impl LinkError {
    /// A read that gave up because the socket's read timeout passed.
    pub fn is_timeout(&self) -> bool {
        matches!(self, LinkError::Frame(FrameIoError::Io(e)) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
    }
}

enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
    #[cfg(feature = "nitro")]
    Vsock(vsock::VsockStream),
}

/// One connection to the worker after the `Hello` exchange.
pub struct WorkerLink {
    stream: Stream,
}

macro_rules! each {
    ($stream:expr, $s:ident => $body:expr) => {
        match $stream {
            Stream::Unix($s) => $body,
            Stream::Tcp($s) => $body,
            #[cfg(feature = "nitro")]
            Stream::Vsock($s) => $body,
        }
    };
}

impl WorkerLink {
    /// Writes one frame and flushes it.
    pub fn send(&mut self, message: &Message) -> Result<(), LinkError> {
        frame::write_frame(self, message)?;
        self.flush().map_err(FrameIoError::from)?;
        Ok(())
    }

    /// Reads one frame; a clean end of stream is [`LinkError::Closed`].
    pub fn recv(&mut self) -> Result<Message, LinkError> {
        frame::read_frame(self)?.ok_or(LinkError::Closed)
    }

    /// A second handle on the same connection, so one thread can write while another reads.
    pub fn try_clone(&self) -> io::Result<WorkerLink> {
        let stream = match &self.stream {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            #[cfg(feature = "nitro")]
            Stream::Vsock(s) => Stream::Vsock(s.try_clone()?),
        };
        Ok(WorkerLink { stream })
    }

    /// Ends the connection in both directions: a thread blocked on it wakes with an error.
    pub fn shutdown(&self) {
        let _ = each!(&self.stream, s => s.shutdown(Shutdown::Both));
    }

    /// `None`: block forever.
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        each!(&self.stream, s => s.set_read_timeout(timeout))
    }

    /// `None`: block forever.
    pub fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        each!(&self.stream, s => s.set_write_timeout(timeout))
    }

    /// A frame the worker sent unasked on an idle connection (a usage receipt on control), read
    /// without blocking when none has begun: `Ok(None)` when nothing is waiting. Once a frame's
    /// first byte is there, the rest is read under the link's read timeout.
    pub fn poll_frame(&mut self) -> Result<Option<Message>, LinkError> {
        let io_error = |e: io::Error| LinkError::Frame(FrameIoError::from(e));
        each!(&self.stream, s => s.set_nonblocking(true)).map_err(io_error)?;
        let mut first_byte = [0u8; 1];
        let first = loop {
            match self.read(&mut first_byte) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        let blocking = each!(&self.stream, s => s.set_nonblocking(false));
        match first {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return blocking.map(|()| None).map_err(io_error),
            Err(e) => return Err(io_error(e)),
            Ok(0) => return Err(LinkError::Closed),
            Ok(_) => blocking.map_err(io_error)?,
        }
        let mut rest = first_byte.chain(&mut *self);
        frame::read_frame(&mut rest)?.ok_or(LinkError::Closed).map(Some)
    }

    /// Whether the worker has gone (closed, reset, or sent bytes nobody asked for), checked
    /// without blocking. An idle control connection is how a restarted worker shows itself.
    pub fn is_broken(&mut self) -> bool {
        if each!(&self.stream, s => s.set_nonblocking(true)).is_err() {
            return true;
        }
        let mut byte = [0u8; 1];
        let broken = match self.read(&mut byte) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => false,
            _ => true,
        };
        broken || each!(&self.stream, s => s.set_nonblocking(false)).is_err()
    }
}

impl Read for WorkerLink {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        each!(&mut self.stream, s => s.read(buf))
    }
}

impl Write for WorkerLink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        each!(&mut self.stream, s => s.write(buf))
    }
    fn flush(&mut self) -> io::Result<()> {
        each!(&mut self.stream, s => s.flush())
    }
}

/// A message's type, for logs and errors: frames may carry large ciphertexts, never print them.
pub fn describe(message: &Message) -> &'static str {
    match message {
        Message::Hello { .. } => "Hello",
        Message::KmsCredentialsRequest { .. } => "KmsCredentialsRequest",
        Message::KmsCredentials { .. } => "KmsCredentials",
        Message::KmsFailed { .. } => "KmsFailed",
        Message::FetchObject { .. } => "FetchObject",
        Message::ObjectData { .. } => "ObjectData",
        Message::ObjectMissing { .. } => "ObjectMissing",
        Message::PublishAttestation { .. } => "PublishAttestation",
        Message::Attest { .. } => "Attest",
        Message::Attested { .. } => "Attested",
        Message::UseFleetEpoch { .. } => "UseFleetEpoch",
        Message::CreateFleetEpoch { .. } => "CreateFleetEpoch",
        Message::FleetEpochCreated { .. } => "FleetEpochCreated",
        Message::LoadModel { .. } => "LoadModel",
        Message::CollectUsage { .. } => "CollectUsage",
        Message::Status { .. } => "Status",
        Message::LoadModelIfFits { .. } => "LoadModelIfFits",
        Message::ModelWouldEvict { .. } => "ModelWouldEvict",
        Message::ModelEvicted { .. } => "ModelEvicted",
        Message::ListModels => "ListModels",
        Message::ModelMemory { .. } => "ModelMemory",
        Message::JobStart { .. } => "JobStart",
        Message::Input { .. } => "Input",
        Message::InputEnd => "InputEnd",
        Message::Output { .. } => "Output",
        Message::Progress { .. } => "Progress",
        Message::JobDone { .. } => "JobDone",
        Message::JobFailed { .. } => "JobFailed",
        Message::OnlineRequest { .. } => "OnlineRequest",
        Message::OnlineResponse { .. } => "OnlineResponse",
        Message::OnlineRefused { .. } => "OnlineRefused",
        Message::UsageReceipt { .. } => "UsageReceipt",
        Message::Error { .. } => "Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_endpoints() {
        assert_eq!(WorkerEndpoint::parse("unix:/tmp/w.sock").unwrap(), WorkerEndpoint::Unix("/tmp/w.sock".into()));
        assert_eq!(WorkerEndpoint::parse("tcp:127.0.0.1:5005").unwrap(), WorkerEndpoint::Tcp("127.0.0.1:5005".into()));
        assert_eq!(WorkerEndpoint::parse("unix:/a").unwrap().to_string(), "unix:/a");
        assert!(WorkerEndpoint::parse("unix:").is_err());
        assert!(WorkerEndpoint::parse("tcp:5005").is_err());
        assert!(WorkerEndpoint::parse("http://x").is_err());
        #[cfg(not(feature = "nitro"))]
        assert!(WorkerEndpoint::parse("vsock:16:5000").is_err());
        #[cfg(feature = "nitro")]
        assert_eq!(WorkerEndpoint::parse("vsock:16:5000").unwrap(), WorkerEndpoint::Vsock { cid: 16, port: 5000 });
    }

    #[test]
    fn hello_exchange_and_broken_detection() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let hello = frame::read_frame(&mut conn).unwrap().unwrap();
            assert_eq!(hello, Message::Hello { role: Role::Host, channel: Channel::Control });
            frame::write_frame(&mut conn, &Message::Hello { role: Role::Enclave, channel: Channel::Control }).unwrap();
            // Hold the connection until the client has checked it is alive.
            let _ = frame::read_frame(&mut conn);
        });
        let endpoint = WorkerEndpoint::Unix(path);
        let mut link = endpoint.connect(Channel::Control).unwrap();
        assert!(!link.is_broken());
        link.send(&Message::InputEnd).unwrap();
        server.join().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(link.is_broken());
    }
}
