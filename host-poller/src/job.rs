//! One attempt of a job on its own connection (DESIGN.md §5 steps 4–6): `JobStart`, the sealed
//! input streamed in as `Input` frames from one thread while this one writes the `Output` frames
//! to the attempt's object — full duplex, since the worker seals results while input still
//! arrives — until the worker's `JobDone` or `JobFailed`.
//!
//! Nothing is committed here: the caller commits the output only once it holds a receipt, and
//! an abandoned attempt drops its writer, which abandons the upload.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use cloud::{ObjectError, ObjectStore, ObjectWriter};
use protocol::envelope::JobId;
use protocol::frame::{Channel, Message, MAX_DATA_LEN};
use protocol::FailedCheck;

use crate::shared::Shared;
use crate::worker_link::{describe, LinkError, WorkerEndpoint, WorkerLink};

/// How an attempt ended when the worker gave a verdict.
pub(crate) enum Verdict {
    /// The sealed output is in the (uncommitted) writer; `receipt` is the signed receipt.
    Done { receipt: Vec<u8>, output: Box<dyn ObjectWriter>, output_bytes: u64 },
    /// The worker refused the job; `check` names what failed.
    Failed { check: FailedCheck, message: String },
}

/// Why an attempt ended without a verdict; every one of these is worth another attempt.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AttemptError {
    #[error("worker: {0}")]
    Link(#[from] LinkError),
    #[error("the worker sent {0} on a job channel")]
    Unexpected(&'static str),
    #[error("the worker sent nothing for {0:?}")]
    Stalled(Duration),
    #[error("reading the sealed input: {0}")]
    Input(ObjectError),
    #[error("writing the sealed output: {0}")]
    Output(std::io::Error),
    #[error("released: the host is shutting down")]
    Aborted,
}

impl AttemptError {
    /// The name a status file shows for this failure.
    pub fn check(&self) -> &'static str {
        match self {
            AttemptError::Link(_) | AttemptError::Unexpected(_) => "connection",
            AttemptError::Stalled(_) => "stalled",
            AttemptError::Input(_) => "input",
            AttemptError::Output(_) => "output",
            AttemptError::Aborted => "released",
        }
    }
}

pub(crate) struct Attempt<'a> {
    pub endpoint: &'a WorkerEndpoint,
    pub shared: &'a Arc<Shared>,
    pub jobs: &'a Arc<dyn ObjectStore>,
    pub input_key: &'a str,
    pub job: &'a JobId,
    pub attempt: u64,
    /// Longest silence from the worker before the attempt is given up.
    pub stall_timeout: Duration,
}

impl Attempt<'_> {
    /// Runs the attempt, writing output into `output`; `progress` sees (records, tokens).
    pub fn run(&self, mut output: Box<dyn ObjectWriter>, progress: &mut dyn FnMut(u64, u64)) -> Result<Verdict, AttemptError> {
        let input = crate::retry::transient("open input", || self.jobs.reader(self.input_key)).map_err(AttemptError::Input)?;
        let mut link = self.endpoint.connect(Channel::Job)?;
        link.set_read_timeout(Some(self.stall_timeout)).map_err(|e| AttemptError::Link(LinkError::Frame(e.into())))?;
        link.send(&Message::JobStart { job_id: *self.job, attempt: self.attempt })?;
        let writer_link = link.try_clone().map_err(|e| AttemptError::Link(LinkError::Frame(e.into())))?;
        let _inflight = self.shared.track(link.try_clone().map_err(|e| AttemptError::Link(LinkError::Frame(e.into())))?);

        std::thread::scope(|scope| {
            let pump = scope.spawn(|| pump_input(input, writer_link, self.input_key));
            let result = self.read_output(&mut link, &mut output, progress);
            // The verdict is in (or the attempt is lost): whatever input is still on its way
            // is not needed, and a pump blocked on a worker that stopped reading wakes up.
            link.shutdown();
            let pumped = pump.join().unwrap_or(Err(PumpError::Panicked));
            if self.shared.is_aborting() && !matches!(result, Ok(Reading::Done { .. })) {
                return Err(AttemptError::Aborted);
            }
            match (result, pumped) {
                (Ok(Reading::Done { receipt, output_bytes }), _) => Ok(Verdict::Done { receipt, output, output_bytes }),
                (Ok(Reading::Failed { check, message }), _) => Ok(Verdict::Failed { check, message }),
                // The input's own failure explains a connection the pump cut.
                (Err(_), Err(PumpError::Input(error))) => Err(AttemptError::Input(error)),
                (Err(error), _) => Err(error),
            }
        })
    }

    fn read_output(
        &self,
        link: &mut WorkerLink,
        output: &mut Box<dyn ObjectWriter>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Reading, AttemptError> {
        let mut output_bytes = 0u64;
        loop {
            let message = match link.recv() {
                Ok(message) => message,
                Err(error) if error.is_timeout() => return Err(AttemptError::Stalled(self.stall_timeout)),
                Err(error) => return Err(error.into()),
            };
            match message {
                Message::Output { data } => {
                    output.write_all(&data).map_err(AttemptError::Output)?;
                    output_bytes += data.len() as u64;
                }
                Message::Progress { records, tokens } => progress(records, tokens),
                Message::JobDone { receipt } => {
                    output.flush().map_err(AttemptError::Output)?;
                    return Ok(Reading::Done { receipt, output_bytes });
                }
                Message::JobFailed { check, message } => return Ok(Reading::Failed { check, message }),
                other => return Err(AttemptError::Unexpected(describe(&other))),
            }
        }
    }
}

enum Reading {
    Done { receipt: Vec<u8>, output_bytes: u64 },
    Failed { check: FailedCheck, message: String },
}

#[derive(Debug)]
enum PumpError {
    Input(ObjectError),
    /// The worker stopped reading (it refused the job, or died): its verdict or the reader's
    /// error tells the rest.
    Link,
    Panicked,
}

/// Streams the sealed input as `Input` frames and `InputEnd`.
fn pump_input(mut input: Box<dyn Read + Send>, mut link: WorkerLink, key: &str) -> Result<u64, PumpError> {
    let mut buffer = vec![0u8; MAX_DATA_LEN];
    let mut sent = 0u64;
    loop {
        let n = match input.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => {
                // The worker would wait for more input forever: cut the connection.
                link.shutdown();
                return Err(PumpError::Input(ObjectError::io(key, error)));
            }
        };
        link.send(&Message::Input { data: buffer[..n].to_vec() }).map_err(|_| PumpError::Link)?;
        sent += n as u64;
    }
    link.send(&Message::InputEnd).map_err(|_| PumpError::Link)?;
    Ok(sent)
}
