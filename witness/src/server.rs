//! The witness's HTTP/1.1 interface: `POST <prefix>/add-checkpoint` and
//! `GET <prefix>/<origin hash>/checkpoint`, one request per connection.

use std::io::Write as _;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use protocol::kms_api::{read_http_message, StartLine};

use crate::witness::Witness;

/// Largest request read (a checkpoint note is at most 256 KiB; 63 proof lines are small).
const MAX_REQUEST: usize = 512 * 1024;

struct Answer {
    status: u16,
    content_type: &'static str,
    body: String,
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        422 => "Unprocessable Entity",
        _ => "Internal Server Error",
    }
}

fn route(witness: &Witness, prefix: &str, method: &str, path: &str, body: &[u8]) -> Answer {
    let text = |status, body: String| Answer { status, content_type: "text/plain; charset=utf-8", body };
    let Some(path) = path.strip_prefix(prefix) else { return text(404, "not found\n".into()) };
    if path == "/add-checkpoint" {
        if method != "POST" {
            return text(405, "POST only\n".into());
        }
        return match witness.add_checkpoint(body) {
            Ok(line) => text(200, line),
            Err(refusal) => {
                tracing::warn!(check = refusal.check(), %refusal, "checkpoint not cosigned");
                match refusal {
                    crate::witness::Refusal::Conflict { known, .. } => {
                        Answer { status: 409, content_type: "text/x.tlog.size", body: format!("{known}\n") }
                    }
                    other => text(other.status(), format!("{}: {other}\n", other.check())),
                }
            }
        };
    }
    if method == "GET"
        && let Some(hash) = path.strip_prefix('/').and_then(|p| p.strip_suffix("/checkpoint"))
        && let Some(note) = witness.latest(hash)
    {
        return text(200, note);
    }
    text(404, "not found\n".into())
}

fn handle(witness: &Witness, prefix: &str, mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
    let answer = match read_http_message(&mut stream, true, MAX_REQUEST) {
        Ok(request) => match &request.start {
            StartLine::Request { method, path } => route(witness, prefix, method, path, &request.body),
            StartLine::Response { .. } => return,
        },
        Err(e) => Answer { status: 400, content_type: "text/plain; charset=utf-8", body: format!("request: {e}\n") },
    };
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        answer.status,
        reason(answer.status),
        answer.content_type,
        answer.body.len()
    );
    let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(answer.body.as_bytes()));
}

/// Serves until `stop` is set (checked between connections and every 20 ms while idle).
pub fn serve(listener: TcpListener, witness: Arc<Witness>, prefix: String, stop: Arc<AtomicBool>) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                let (witness, prefix) = (Arc::clone(&witness), prefix.clone());
                std::thread::spawn(move || handle(&witness, &prefix, stream));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => tracing::warn!(error = %e, "accept"),
        }
    }
    Ok(())
}
