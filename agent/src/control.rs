//! The control socket: JSON lines over a UNIX socket, one request and one
//! response per line (status.rs defines both).  Who may ask what is decided
//! by the peer's credentials (SO_PEERCRED), at accept, before the peer is
//! given anything: reading is for root and the configured group, changing
//! state (reload) for root only; anyone else is turned away at once, told
//! how to get access.  Each client is served by its own task with a line
//! limit and timeouts, so a client that stalls or floods holds only itself
//! up, and each user holds a few client slots at most, so root always gets in.

use std::{
    io::Write,
    os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
    sync::{mpsc, oneshot, watch},
};

use crate::{
    counters::Counters,
    metrics::Dialect,
    policies::PolicySet,
    status::{Command, PROTOCOL, Request, Response, Status},
};

mod peers;

pub(crate) use peers::SubUids;
use peers::{Limits, Peers, Slots};

const MAX_LINE: u64 = 64 * 1024;
const MAX_CLIENTS: usize = 32;
/// Slots one non-root user may hold: wbctl needs one, `watch` plus a few
/// scripts a handful.
const PER_USER: usize = 4;
/// Slots only root may take, however many users the control group has.
const ROOT_RESERVED: usize = 8;
/// The control socket's slots: local users only.
const CONTROL: Limits =
    Limits { total: MAX_CLIENTS, per_user: PER_USER, users: MAX_CLIENTS - ROOT_RESERVED, per_host: 0, hosts: 0 };
/// The metrics listener's: local users as on the control socket, and a
/// pool of their own for other hosts (a fleet's scrapers), two each: a
/// scraper needs one at a time.
const METRICS: Limits = Limits { total: 64, per_user: PER_USER, users: 24, per_host: 2, hosts: 32 };
const IDLE: Duration = Duration::from_secs(10);
/// A failed accept (EMFILE: the connection stays queued, and the next
/// accept fails at once) waits this long before the next: a retry at
/// once would spin, and take a CPU from the thread that drains events.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// A reload the intake loop is asked for.
pub(crate) struct Reload;

/// One request for a status snapshot: where the intake loop sends it.
pub(crate) type Ask = oneshot::Sender<Arc<Status>>;

/// The socket's side of the intake loop.  Status is built when a client
/// asks for it, by the loop (it owns what the status reports), between
/// its slices of a flood; the clients are served on a thread of their own
/// (`spawn_control`), which waits for that snapshot and does the rest.
#[derive(Clone)]
pub(crate) struct Handle {
    snapshots: mpsc::Sender<Ask>,
    reloads: mpsc::UnboundedSender<Reload>,
    /// The policies in force, replaced at each reload.
    policies: watch::Receiver<Arc<PolicySet>>,
}

/// The intake loop's side: what it is asked, and the policies it tells.
pub(crate) struct Requests {
    pub(crate) snapshots: mpsc::Receiver<Ask>,
    pub(crate) reloads: mpsc::UnboundedReceiver<Reload>,
    pub(crate) policies: watch::Sender<Arc<PolicySet>>,
}

/// The two sides, the policies in force at start.
pub(crate) fn channel(policies: PolicySet) -> (Handle, Requests) {
    // Every client of either listener waits for its answer before it asks
    // again: room for all of them, so that asking never waits.
    let (ask, snapshots) = mpsc::channel(2 * MAX_CLIENTS);
    let (reload, reloads) = mpsc::unbounded_channel();
    let (tell, policies) = watch::channel(Arc::new(policies));
    (Handle { snapshots: ask, reloads: reload, policies }, Requests { snapshots, reloads, policies: tell })
}

impl Handle {
    /// A status snapshot from the intake loop; None once it has stopped.
    async fn status(&self) -> Option<Arc<Status>> {
        let (ask, answer) = oneshot::channel();
        self.snapshots.send(ask).await.ok()?;
        answer.await.ok()
    }
}

pub(crate) struct Server {
    path: PathBuf,
}

impl Server {
    /// Binds the socket (replacing a stale one) in a directory only root
    /// may change: whoever could replace the socket could pose as the
    /// daemon to root's wbctl.  Mode 0666: anyone may connect and is told at
    /// once, in words, whether and how it may ask (a socket owned by the
    /// control group instead would need CAP_CHOWN, which the unit does not
    /// grant); the daemon decides by the peer's credentials.
    /// A std listener: bound before the runtime exists, so that a taken
    /// path fails start-up; `serve` hands it to tokio.
    pub(crate) fn bind(path: &Path) -> Result<(Self, std::os::unix::net::UnixListener)> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .with_context(|| format!("creating {}", dir.display()))?;
            check_dir(dir)?;
        }
        let _ = std::fs::remove_file(path);
        let listener = std::os::unix::net::UnixListener::bind(path)
            .with_context(|| format!("binding the control socket {}", path.display()))?;
        listener.set_nonblocking(true)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
        Ok((Self { path: path.to_owned() }, listener))
    }
}

/// The socket's directory is root's and nobody else may add or remove
/// entries in it (a sticky directory like /tmp protects root's entries).
fn check_dir(dir: &Path) -> Result<()> {
    let m = std::fs::metadata(dir).with_context(|| format!("checking {}", dir.display()))?;
    let others_may_replace = m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0;
    if m.uid() != 0 || others_may_replace {
        bail!(
            "the control socket's directory {} must belong to root and not be writable by others \
             (owner uid {}, mode {:o}): another user could replace the socket",
            dir.display(),
            m.uid(),
            m.mode() & 0o7777
        );
    }
    Ok(())
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What a peer that may not read is told: who may, and how to get there.
fn refusal(read_group: Option<u32>) -> String {
    match read_group {
        None => "permission denied: only root may use writebehindd's control socket; to let a group read its \
                 state, start the daemon with --control-group GROUP"
            .into(),
        Some(g) => format!(
            "permission denied: writebehindd answers root and members of group {} (its --control-group); \
             ask to be added to that group",
            group_name(g)
        ),
    }
}

/// "name (gid N)", or the number alone when the group has no name.
fn group_name(gid: u32) -> String {
    // Called once, when serving starts; no other thread looks groups up (getgrgid's answer is shared).
    let gr = unsafe { libc::getgrgid(gid) };
    if gr.is_null() {
        return format!("gid {gid}");
    }
    let name = unsafe { std::ffi::CStr::from_ptr((*gr).gr_name) }.to_string_lossy();
    format!("{name} (gid {gid})")
}

/// Answers a peer that gets no slot with one line and hangs up.  One
/// non-blocking write: a refused peer gets no task and no time of ours.
fn turn_away(stream: UnixStream, why: &str) {
    let Ok(mut stream) = stream.into_std() else { return };
    let line = serde_json::to_string(&Response::err(why)).unwrap_or_default() + "\n";
    let _ = stream.write(line.as_bytes());
}

/// The control socket served until this is dropped.
pub(crate) struct Serving {
    _stop: oneshot::Sender<()>,
}

/// A runtime for a listener's thread (`spawn_control`, `spawn_metrics`):
/// built at start, before "attached" is logged.  Built on the thread, after
/// it, its descriptors (an epoll, an eventfd) came after those a caller had
/// counted as the daemon's at that line (hardening's failing accept caps
/// the daemon there), and a failure left the daemon running unreachable.
/// Blocking threads: reads of sysfs and /etc/subuid.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().max_blocking_threads(4).build()?)
}

/// Serves the control socket on a thread of its own, on `rt` (`runtime`).
/// On the intake's, every await of a client (its request line, the
/// snapshot, a reply larger than the socket's buffer) waited behind the
/// intake's other work: `status` took 142-319 ms with 1,000 streams
/// (bench `cost --parts streams`).  Dropped (the daemon stopping), the
/// thread stops accepting, and its clients are dropped.
pub(crate) fn spawn_control(
    rt: tokio::runtime::Runtime,
    listener: std::os::unix::net::UnixListener,
    daemon: Handle,
    read_group: Option<u32>,
    owners: Arc<SubUids>,
    counters: Arc<Counters>,
) -> Serving {
    let (stop, stopped) = oneshot::channel::<()>();
    on_own_thread("wb-control", "the control socket", rt, move || async move {
        tokio::select! {
            _ = serve(listener, daemon, read_group, owners, counters) => {}
            _ = stopped => {}
        }
    });
    Serving { _stop: stop }
}

/// Runs `serve`'s future on `rt`, on a thread named `name`; `what` names
/// it if the thread cannot be had.
fn on_own_thread<F: std::future::Future<Output = ()>>(
    name: &str,
    what: &'static str,
    rt: tokio::runtime::Runtime,
    serve: impl FnOnce() -> F + Send + 'static,
) {
    let spawned = std::thread::Builder::new().name(name.into()).spawn(move || rt.block_on(serve()));
    if let Err(e) = spawned {
        tracing::error!(error = %e, "no thread for {what}: not served");
    }
}

/// Accepts clients until the listener is dropped.
async fn serve(
    listener: std::os::unix::net::UnixListener,
    daemon: Handle,
    read_group: Option<u32>,
    owners: Arc<SubUids>,
    counters: Arc<Counters>,
) {
    let listener = match UnixListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => return tracing::error!(error = %e, "control socket unusable"),
    };
    let slots = Slots::new(CONTROL);
    // Composed once: a flood of refused peers costs no group lookups.
    let refused = refusal(read_group);
    let mut failing = false;
    loop {
        let Some((stream, _)) = accepted(listener.accept().await, &mut failing).await else { continue };
        // Credentials first: a peer that may not read takes no slot.
        let Ok(cred) = stream.peer_cred() else { continue };
        let uid = cred.uid();
        if uid != 0 && !read_group.is_some_and(|g| in_group(&stream, cred.gid(), g)) {
            turn_away(stream, &refused);
            continue;
        }
        // A subordinate uid counts as its owner (SO_PEERCRED gives the uid
        // as this namespace sees it: a rootless container's, 100000 on).
        let Some(slot) = slots.take(peers::local(uid, &owners)) else {
            counters.add(&counters.control_refused, 1);
            let why =
                format!("too many connections from uid {uid} (at most {PER_USER} per user); close some and retry");
            turn_away(stream, &why);
            continue;
        };
        let daemon = daemon.clone();
        tokio::spawn(async move {
            let _ = client(stream, uid, daemon).await;
            drop(slot);
        });
    }
}

/// What an accept gave; after an error, None once ACCEPT_BACKOFF has
/// passed (logged at the first of a run of failures).
async fn accepted<T>(result: std::io::Result<T>, failing: &mut bool) -> Option<T> {
    match result {
        Ok(v) => {
            *failing = false;
            Some(v)
        }
        Err(e) => {
            if !std::mem::replace(failing, true) {
                tracing::warn!(error = %e, "cannot accept connections; retrying every 100 ms");
            }
            tokio::time::sleep(ACCEPT_BACKOFF).await;
            None
        }
    }
}

/// One admitted client: root or a member of the control group.
async fn client(stream: UnixStream, uid: u32, daemon: Handle) -> Result<()> {
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
            Ok(r) => answer(&r.cmd, uid, &daemon).await,
        };
        reply(&mut write, &response).await?;
    }
}

/// One request line, decoded, or the error response it earns: another
/// protocol version, a command this daemon does not have, or a line that
/// is not a request.
pub fn parse_request(line: &str) -> Result<Request, Response> {
    let version = |v| Response::err(format!("protocol version {v} not spoken (this daemon: {PROTOCOL})"));
    let e = match serde_json::from_str::<Request>(line) {
        Ok(r) if r.v == PROTOCOL => return Ok(r),
        Ok(r) => return Err(version(r.v)),
        Err(e) => e,
    };
    /// What any request names, for a refusal that says what it asked.
    #[derive(serde::Deserialize)]
    struct Head {
        v: u32,
        cmd: String,
    }
    Err(match serde_json::from_str::<Head>(line) {
        Ok(h) if h.v != PROTOCOL => version(h.v),
        Ok(h) if !Command::NAMES.contains(&h.cmd.as_str()) => {
            Response::err(format!("unknown command {:?} (known: {})", h.cmd, Command::NAMES.join(", ")))
        }
        _ => Response::err(format!("malformed request: {e}")),
    })
}

/// The answer to an admitted client's request: reading for all of them,
/// reload for root.
async fn answer(cmd: &Command, uid: u32, daemon: &Handle) -> Response {
    let stopping = || Response::err("the daemon is stopping");
    match cmd {
        Command::Status | Command::Streams | Command::Devices | Command::Units | Command::Metrics { .. } => {
            let Some(s) = daemon.status().await else { return stopping() };
            Response::ok(match cmd {
                Command::Streams => json(&s.streams),
                Command::Devices => json(&s.devices),
                Command::Units => json(&s.units),
                Command::Metrics { openmetrics } => {
                    let dialect = if *openmetrics { Dialect::OpenMetrics } else { Dialect::Prometheus };
                    serde_json::Value::String(metrics_text(s, dialect).await)
                }
                _ => json(&*s),
            })
        }
        Command::Policy { pid, cgroup } => {
            let path = match (cgroup, pid) {
                (Some(c), _) => c.clone(),
                (None, Some(pid)) => match cgroup_of(*pid) {
                    Some(c) => c,
                    None => return Response::err(format!("no process {pid} (or it has no cgroup v2 path)")),
                },
                (None, None) => "/".into(),
            };
            let p = daemon.policies.borrow().resolve(&path);
            let lines: serde_json::Map<String, serde_json::Value> =
                p.lines().into_iter().map(|(k, v)| (k.to_owned(), serde_json::Value::String(v))).collect();
            Response::ok(serde_json::json!({ "cgroup": path, "policy": lines }))
        }
        Command::Reload if uid != 0 => Response::err("permission denied: reload needs root"),
        Command::Reload => match daemon.reloads.send(Reload) {
            Ok(()) => Response::ok(serde_json::Value::String("reload requested".into())),
            Err(_) => stopping(),
        },
    }
}

/// The metrics of snapshot `s` with every bdi's state, read on a
/// blocking thread: the intake loop shares this one.
async fn metrics_text(s: Arc<Status>, dialect: Dialect) -> String {
    let read = {
        let s = s.clone();
        tokio::task::spawn_blocking(move || crate::bdis::read(&s.devices))
    };
    let bdis = read.await.unwrap_or_default();
    let mut families = crate::metrics::families(&s, &bdis, dialect);
    crate::units::metrics::unit_families(&mut families, &s.units);
    families.finish()
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

/// Whether the peer (primary group `gid`) is in group `group`, counting
/// its supplementary groups as they were when it connected
/// (SO_PEERGROUPS).  Not from /proc/<pid>/status, which is the process
/// that has that pid when the daemon looks: the peer may have exited, or
/// handed the connection on.
fn in_group(stream: &UnixStream, gid: u32, group: u32) -> bool {
    use std::os::fd::AsRawFd;
    gid == group || peer_groups(stream.as_raw_fd()).is_some_and(|g| g.contains(&group))
}

/// SO_PEERGROUPS (Linux 4.13): the supplementary groups of the process
/// that connected, as the socket recorded them then.  Its value is 59 on
/// every architecture the package is built for (asm-generic/socket.h).
const SO_PEERGROUPS: libc::c_int = 59;

fn peer_groups(fd: std::os::fd::RawFd) -> Option<Vec<u32>> {
    let mut groups = vec![0u32; 64];
    for _ in 0..2 {
        let mut len = (groups.len() * 4) as libc::socklen_t;
        let got =
            unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, SO_PEERGROUPS, groups.as_mut_ptr().cast(), &mut len) };
        if got == 0 {
            groups.truncate(len as usize / 4);
            return Some(groups);
        }
        // ERANGE: len now says how much room the groups need.
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::ERANGE) {
            return None;
        }
        groups.resize(len as usize / 4 + 1, 0);
    }
    None
}

/// The cgroup v2 path of a process ("0::/system.slice/x.service").
pub(crate) fn cgroup_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|l| l.strip_prefix("0::")).map(str::to_owned)
}

/// The optional OpenMetrics endpoint (--metrics-listen): GET /metrics over
/// plain HTTP, for a fleet's Prometheus.  Read-only, same data as `wbctl
/// metrics`; anything else gets 404.  Off unless asked for.  Served by a
/// thread of its own, with a runtime of its own: a flood of connections
/// and the peers' lookups cost the thread that drains events and pings the
/// watchdog nothing (it only builds the status a scrape asks for).
pub(crate) fn spawn_metrics(
    rt: tokio::runtime::Runtime,
    listener: std::net::TcpListener,
    daemon: Handle,
    owners: Arc<SubUids>,
    counters: Arc<Counters>,
) {
    on_own_thread("wb-metrics", "the metrics listener", rt, move || serve_metrics(listener, daemon, owners, counters));
}

async fn serve_metrics(listener: std::net::TcpListener, daemon: Handle, owners: Arc<SubUids>, counters: Arc<Counters>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => return tracing::error!(error = %e, "metrics listener unusable"),
    };
    let Ok(listening) = listener.local_addr() else { return };
    let peers = Peers::new(listening, owners);
    let slots = Slots::new(METRICS);
    let mut failing = false;
    loop {
        let Some((mut stream, peer)) = accepted(listener.accept().await, &mut failing).await else { continue };
        // Counted per local user, as on the control socket: a user holding
        // connections open (each for up to IDLE) took every slot, and the
        // fleet's scraper got none.  Peers from elsewhere by their host.
        // One lookup at a time, here: connections beyond it wait in the
        // kernel's backlog, bounded by the kernel.
        let Ok(me) = stream.local_addr() else { continue };
        let Some(permit) = slots.take(peers.who(me, peer)) else {
            counters.add(&counters.metrics_refused, 1);
            continue;
        };
        let daemon = daemon.clone();
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
                let Some(status) = daemon.status().await else { return };
                let body = metrics_text(status, Dialect::OpenMetrics).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_user_cannot_take_roots_slots() {
        use peers::Who::{Root, User};
        let slots = Slots::new(CONTROL);
        let mine: Vec<_> = (0..PER_USER).map_while(|_| slots.take(User(65534))).collect();
        assert_eq!(mine.len(), PER_USER);
        assert!(slots.take(User(65534)).is_none(), "a user beyond its share");
        // Many users together stop short of root's reserve.
        let others: Vec<_> = (1000..1100).filter_map(|uid| slots.take(User(uid))).collect();
        assert_eq!(mine.len() + others.len(), MAX_CLIENTS - ROOT_RESERVED);
        let root: Vec<_> = (0..MAX_CLIENTS).map_while(|_| slots.take(Root)).collect();
        assert_eq!(root.len(), ROOT_RESERVED);
        // A slot given back is free again, for its user.
        drop(mine);
        let again = slots.take(User(65534));
        assert!(again.is_some());
        assert_eq!(slots.held(User(65534)), 1);
    }

    #[test]
    fn the_sockets_directory_must_be_roots_alone() {
        if unsafe { libc::geteuid() } != 0 {
            return; // the directories below would not be root's
        }
        let base = std::env::temp_dir().join(format!("wb-control-dir-{}", std::process::id()));
        for (mode, ok) in [(0o755, true), (0o1777, true), (0o777, false), (0o775, false)] {
            std::fs::create_dir_all(&base).unwrap();
            std::fs::set_permissions(&base, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(check_dir(&base).is_ok(), ok, "mode {mode:o}");
        }
        std::fs::remove_dir(&base).unwrap();
    }

    #[test]
    fn a_refused_request_is_told_what_was_wrong() {
        let err = |line: &str| parse_request(line).unwrap_err().error.unwrap();
        assert_eq!(err("garbage\n"), "malformed request: expected value at line 1 column 1");
        assert_eq!(err("{}\n"), "malformed request: missing field `v` at line 1 column 2");
        assert!(err(r#"{"v":1}"#).starts_with("malformed request: missing field `cmd`"), "{}", err(r#"{"v":1}"#));
        assert!(err(r#"{"v":1,"cmd":"policy","pid":"x"}"#).starts_with("malformed request: "));
        for line in [r#"{"v":99,"cmd":"status"}"#, r#"{"v":99,"cmd":"format-disk"}"#] {
            assert_eq!(err(line), "protocol version 99 not spoken (this daemon: 1)");
        }
        assert_eq!(
            err(r#"{"v":1,"cmd":"format-disk"}"#),
            r#"unknown command "format-disk" (known: status, streams, devices, policy, metrics, reload, units)"#
        );
        let r = parse_request(r#"{"v":1,"cmd":"policy","pid":7}"#).unwrap();
        assert_eq!(r.cmd, Command::Policy { pid: Some(7), cgroup: None });
    }

    /// Status requests are answered by whoever holds the other side (the
    /// intake loop); once it is gone, clients are told.
    #[test]
    fn status_is_asked_of_the_loop() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (handle, mut requests) = channel(PolicySet::load(&[]).unwrap());
        rt.block_on(async {
            let asked = async {
                let answers = (answer(&Command::Status, 0, &handle).await, answer(&Command::Streams, 0, &handle).await);
                drop(handle);
                answers
            };
            let the_loop = async {
                while let Some(ask) = requests.snapshots.recv().await {
                    let _ = ask.send(Arc::new(Status { kernel: "k".into(), ..Default::default() }));
                }
            };
            let ((status, streams), ()) = tokio::join!(asked, the_loop);
            assert_eq!(status.data.unwrap()["kernel"], "k");
            assert_eq!(streams.data.unwrap(), serde_json::json!([]));
        });
        let (handle, requests) = channel(PolicySet::load(&[]).unwrap());
        drop(requests);
        let stopped = rt.block_on(answer(&Command::Metrics { openmetrics: false }, 0, &handle));
        assert_eq!(stopped.error.as_deref(), Some("the daemon is stopping"));
        let policy = rt.block_on(answer(&Command::Policy { pid: None, cgroup: None }, 0, &handle));
        assert_eq!(policy.data.unwrap()["cgroup"], "/", "the policies are the handle's own");
    }

    #[test]
    fn a_refusal_says_how_to_get_access() {
        assert!(refusal(None).contains("--control-group GROUP"));
        assert!(refusal(Some(0)).contains("group root (gid 0)"), "{}", refusal(Some(0)));
    }
}
