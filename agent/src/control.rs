//! The control socket: JSON lines over a UNIX socket, one request and one
//! response per line (status.rs defines both).  Who may ask what is decided
//! by the peer's credentials (SO_PEERCRED): reading is for root and the
//! configured group, changing state (reload) for root only.  Each client is
//! served by its own task with a line limit and timeouts, so a client that
//! stalls or floods holds only itself up.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context, Result};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
    sync::{Semaphore, mpsc},
};

use crate::{
    policies::PolicySet,
    status::{PROTOCOL, Request, Response, Status, metrics},
};

const MAX_LINE: u64 = 64 * 1024;
const MAX_CLIENTS: usize = 32;
const IDLE: Duration = Duration::from_secs(10);

/// What the intake task publishes for the socket to read.
pub struct Shared {
    pub status: Status,
    pub policies: PolicySet,
}

/// Requests the intake task acts on.
pub enum Command {
    Reload,
}

pub struct Server {
    path: PathBuf,
}

impl Server {
    /// Binds the socket (replacing a stale one), mode 0666: the daemon
    /// itself decides who may do what.
    /// A std listener: bound before the runtime exists, so that a taken
    /// path fails start-up; `serve` hands it to tokio.
    pub fn bind(path: &Path) -> Result<(Self, std::os::unix::net::UnixListener)> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let _ = std::fs::remove_file(path);
        let listener = std::os::unix::net::UnixListener::bind(path)
            .with_context(|| format!("binding the control socket {}", path.display()))?;
        listener.set_nonblocking(true)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
        Ok((Self { path: path.to_owned() }, listener))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Accepts clients until the listener is dropped.
pub async fn serve(
    listener: std::os::unix::net::UnixListener,
    shared: Arc<Mutex<Shared>>,
    commands: mpsc::UnboundedSender<Command>,
    read_group: Option<u32>,
) {
    let listener = match UnixListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => return tracing::error!(error = %e, "control socket unusable"),
    };
    let slots = Arc::new(Semaphore::new(MAX_CLIENTS));
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            // Too many clients: refuse this one rather than queue it.
            tokio::spawn(async move {
                let mut stream = stream;
                let _ = reply(&mut stream, &Response::err("too many clients; try again")).await;
            });
            continue;
        };
        let (shared, commands) = (shared.clone(), commands.clone());
        tokio::spawn(async move {
            let _ = client(stream, shared, commands, read_group).await;
            drop(permit);
        });
    }
}

async fn client(
    stream: UnixStream,
    shared: Arc<Mutex<Shared>>,
    commands: mpsc::UnboundedSender<Command>,
    read_group: Option<u32>,
) -> Result<()> {
    let cred = stream.peer_cred()?;
    let (uid, pid) = (cred.uid(), cred.pid());
    let may_read = uid == 0 || read_group.is_some_and(|g| in_group(pid, cred.gid(), g));
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    loop {
        let mut line = String::new();
        let n = match tokio::time::timeout(IDLE, (&mut lines).take(MAX_LINE).read_line(&mut line)).await {
            Ok(Ok(n)) => n,
            _ => return Ok(()),
        };
        if n == 0 {
            return Ok(());
        }
        if !line.ends_with('\n') && n as u64 >= MAX_LINE {
            let _ = reply(&mut write, &Response::err("request line too long")).await;
            return Ok(());
        }
        let response = match parse_request(&line) {
            Err(refusal) => refusal,
            Ok(r) => answer(&r, uid, may_read, &shared, &commands),
        };
        reply(&mut write, &response).await?;
    }
}

/// One request line, decoded, or the error response it earns.
pub fn parse_request(line: &str) -> Result<Request, Response> {
    match serde_json::from_str::<Request>(line) {
        Err(e) => Err(Response::err(format!("malformed request: {e}"))),
        Ok(r) if r.v != PROTOCOL => {
            Err(Response::err(format!("protocol version {} not spoken (this daemon: {PROTOCOL})", r.v)))
        }
        Ok(r) => Ok(r),
    }
}

fn answer(
    r: &Request,
    uid: u32,
    may_read: bool,
    shared: &Mutex<Shared>,
    commands: &mpsc::UnboundedSender<Command>,
) -> Response {
    let reading = ["status", "streams", "devices", "policy", "metrics"];
    if reading.contains(&r.cmd.as_str()) && !may_read {
        return Response::err("permission denied: reading the daemon's state needs root or its control group");
    }
    let s = shared.lock().unwrap();
    match r.cmd.as_str() {
        "status" => Response::ok(json(&s.status)),
        "streams" => Response::ok(json(&s.status.streams)),
        "devices" => Response::ok(json(&s.status.devices)),
        "metrics" => Response::ok(serde_json::Value::String(metrics(&s.status))),
        "policy" => {
            let path = match (&r.cgroup, r.pid) {
                (Some(c), _) => c.clone(),
                (None, Some(pid)) => match cgroup_of(pid) {
                    Some(c) => c,
                    None => return Response::err(format!("no process {pid} (or it has no cgroup v2 path)")),
                },
                (None, None) => "/".into(),
            };
            let p = s.policies.resolve(&path);
            let lines: serde_json::Map<String, serde_json::Value> =
                p.lines().into_iter().map(|(k, v)| (k.to_owned(), serde_json::Value::String(v))).collect();
            Response::ok(serde_json::json!({ "cgroup": path, "policy": lines }))
        }
        "reload" if uid != 0 => Response::err("permission denied: reload needs root"),
        "reload" => match commands.send(Command::Reload) {
            Ok(()) => Response::ok(serde_json::Value::String("reload requested".into())),
            Err(_) => Response::err("the daemon is stopping"),
        },
        other => Response::err(format!(
            "unknown command {other:?} (known: status, streams, devices, policy, metrics, reload)"
        )),
    }
}

fn json<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

async fn reply(w: &mut (impl AsyncWriteExt + Unpin), r: &Response) -> Result<()> {
    let mut line = serde_json::to_string(r)?;
    line.push('\n');
    tokio::time::timeout(IDLE, w.write_all(line.as_bytes())).await.context("client not reading")??;
    Ok(())
}

/// Whether process `pid` (primary group `gid`) is in group `group`,
/// counting its supplementary groups (/proc/<pid>/status).
fn in_group(pid: Option<i32>, gid: u32, group: u32) -> bool {
    if gid == group {
        return true;
    }
    let Some(pid) = pid else { return false };
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return false };
    text.lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .is_some_and(|g| g.split_whitespace().any(|x| x.parse() == Ok(group)))
}

/// The cgroup v2 path of a process ("0::/system.slice/x.service").
pub fn cgroup_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|l| l.strip_prefix("0::")).map(str::to_owned)
}

/// The optional OpenMetrics endpoint (--metrics-listen): GET /metrics over
/// plain HTTP, for a fleet's Prometheus.  Read-only, same data as `wbctl
/// metrics`; anything else gets 404.  Off unless asked for.
pub async fn serve_metrics(listener: std::net::TcpListener, shared: Arc<Mutex<Shared>>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => return tracing::error!(error = %e, "metrics listener unusable"),
    };
    let slots = Arc::new(Semaphore::new(MAX_CLIENTS));
    loop {
        let Ok((mut stream, _)) = listener.accept().await else { continue };
        let Ok(permit) = slots.clone().try_acquire_owned() else { continue };
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            // The request head only, bounded in size and time.
            let read = tokio::time::timeout(IDLE, async {
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
            });
            if read.await.is_err() {
                return;
            }
            let response = if head.starts_with(b"GET /metrics ") {
                let body = metrics(&shared.lock().unwrap().status);
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned()
            };
            let _ = tokio::time::timeout(IDLE, stream.write_all(response.as_bytes())).await;
            drop(permit);
        });
    }
}
