//! The running daemon, built from the command line's options: the BPF
//! programs loaded and attached, the control socket (and the metrics
//! listener) bound, and what the intake loop works on (intake.rs): the
//! stream table, the policies by cgroup, the shares of BPF's stream map.
//! `run` serves until SIGINT/SIGTERM, then detaches everything.

mod intake;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use anyhow::{Context, Result};
use aya::maps::{MapData, RingBuf};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::{
    abi::{wb_config, wb_stat},
    cgroups::CgroupPolicies,
    control,
    counters::Counters,
    devices::Devices,
    loader::{self, Loaded},
    pacing::{Lever, Pacer},
    policies::{self, PolicySet},
    streams::StreamTable,
};
use intake::Intake;

/// What the command line sets for a run.
pub struct Options {
    /// Policy drop-ins (*.toml in name order), then the extra files.
    pub policy_dir: PathBuf,
    pub policy_files: Vec<PathBuf>,
    pub control: PathBuf,
    /// A group that may read the daemon's state besides root.
    pub control_group: Option<u32>,
    pub metrics_listen: Option<SocketAddr>,
    pub backend: loader::Backend,
    pub lever: Lever,
    pub max_streams: usize,
    /// --observe: every acting policy observes (PolicySet::observing).
    pub observe: bool,
}

/// The policies of a run: the directory's files, then the --policy ones,
/// observing everywhere under --observe (`observe`) or a root policy at
/// mode "observe".  Read at start and again at each reload.
pub fn load_policies(dir: &Path, extra: &[PathBuf], observe: bool) -> Result<PolicySet> {
    let mut files = policies::dir_files(dir)?;
    files.extend(extra.iter().cloned());
    PolicySet::load(&files).map(|s| s.observing(observe))
}

/// SIGTERM and SIGINT stop the daemon, SIGHUP reloads the policies.
struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

pub struct Daemon {
    rt: tokio::runtime::Runtime,
    /// The control socket's thread's (control::runtime).
    control_rt: tokio::runtime::Runtime,
    signals: Signals,
    events: RingBuf<MapData>,
    /// Removes the socket when dropped.
    server: control::Server,
    listener: std::os::unix::net::UnixListener,
    metrics: Option<(std::net::TcpListener, tokio::runtime::Runtime)>,
    control_group: Option<u32>,
    /// The control socket's side of the intake loop.
    handle: control::Handle,
    intake: Intake,
}

impl Daemon {
    /// Loads and attaches the programs, binds the sockets: once this
    /// returns, "attached" is logged and the control socket accepts.
    pub fn new(set: PolicySet, options: Options) -> Result<Self> {
        // Signals first: a SIGTERM that arrives while the programs are being
        // attached must stop the daemon cleanly (restoring what it changed),
        // not kill it with the default action.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let signals = {
            let _in_runtime = rt.enter();
            Signals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
                hup: signal(SignalKind::hangup())?,
            }
        };
        // A held file and a pidfd per stream, flush-time handles, clients.
        let want = 2 * options.max_streams as u64 + 1024;
        let nofile = crate::sys::raise_nofile(want);
        if nofile < want {
            tracing::warn!(nofile, want, "RLIMIT_NOFILE is low: streams beyond it are left to the kernel");
        }
        // Before anything is attached: put back bdi limits a killed run left
        // (as --restore does).
        let pacer = Pacer::new(options.lever);
        let root = set.root().clone();
        let cfg = wb_config { dflt: root.to_bpf(), ..Default::default() };
        let mut loaded = Loaded::load_and_attach(cfg, options.backend)?;
        let events = loaded.take_events()?;
        let (config, devices, cgroup_map) = loaded.take_tuning()?;
        let shares = loaded.take_shares()?;
        // Bound before "attached" is logged: whoever waits for that line (the
        // tests, the bench) may connect at once.  The other way round, the
        // bench's smoke run once found no socket there.
        let (server, listener) = control::Server::bind(&options.control)?;
        let control_rt = control::runtime()?;
        let metrics =
            options.metrics_listen.map(|addr| anyhow::Ok((bind_metrics(addr)?, control::runtime()?))).transpose()?;
        tracing::info!(
            window = ?root.window, burst = root.burst.0, pacing = root.pacing, backend = %loaded.backend,
            policies = %set.sources.join(", "), "attached; watching for streaming writers"
        );
        if set.observes() {
            tracing::info!(
                "observing: what would be done is counted (wbctl status), no writeback is started, no dirty limit set"
            );
        }
        let cgroups = CgroupPolicies::new(set, config, cgroup_map);
        let counters = Arc::new(Counters::default());
        let (handle, requests) = control::channel(cgroups.set().clone());
        let mut devices = Devices::new(root, Some(devices), pacer);
        devices.set_observing(cgroups.set().observes());
        let table = StreamTable::new(counters.clone(), devices, options.max_streams);
        let intake = Intake {
            loaded,
            table,
            cgroups,
            shares,
            counters,
            policy_dir: options.policy_dir,
            policy_files: options.policy_files,
            observe: options.observe,
            requests,
            snapshot: Default::default(),
            lag_last_second: 0,
            started: Instant::now(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().into(),
        };
        Ok(Self {
            rt,
            control_rt,
            signals,
            events,
            server,
            listener,
            metrics,
            control_group: options.control_group,
            handle,
            intake,
        })
    }

    /// Serves until SIGINT or SIGTERM; then stops the flushers and
    /// detaches the programs.
    pub fn run(self) -> Result<()> {
        let Self { rt, control_rt, signals, events, server, listener, metrics, control_group, handle, mut intake } =
            self;
        // Read once here, at start; re-read on a blocking thread when it changes.
        let owners = control::SubUids::load("/etc/subuid");
        if let Some((l, metrics_rt)) = metrics {
            control::spawn_metrics(metrics_rt, l, handle.clone(), owners.clone(), intake.counters.clone());
        }
        let serving =
            control::spawn_control(control_rt, listener, handle, control_group, owners, intake.counters.clone());
        let ran = rt.block_on(async {
            crate::sys::notify("READY=1");
            intake.run(events, signals).await
        });
        drop((serving, server));
        ran?;
        intake.stop();
        Ok(())
    }
}

/// The --metrics-listen socket, bound before the runtime exists so that a
/// taken address fails start-up.
fn bind_metrics(addr: SocketAddr) -> Result<std::net::TcpListener> {
    if !addr.ip().is_loopback() {
        tracing::warn!(%addr, "metrics served beyond loopback: anyone who can reach it reads them");
    }
    let l = std::net::TcpListener::bind(addr).with_context(|| format!("--metrics-listen {addr}"))?;
    l.set_nonblocking(true)?;
    tracing::info!(%addr, "serving OpenMetrics at /metrics");
    Ok(l)
}

impl Intake {
    /// The flushers stopped, what the run did logged; the programs detach
    /// as `loaded` drops, first of the fields.
    fn stop(self) {
        let Self { loaded, mut table, counters, .. } = self;
        table.shutdown();
        tracing::info!(
            events = Counters::get(&counters.events),
            streams = Counters::get(&counters.streams_started),
            spans_flushed = Counters::get(&counters.spans_flushed),
            bytes_flushed = Counters::get(&counters.bytes_flushed),
            closed_files_flushed = Counters::get(&counters.closed_files_flushed),
            closed_files_left = Counters::get(&counters.closed_files_left),
            closes_shed_late = Counters::get(&counters.closes_shed_late),
            events_left_by_policy = Counters::get(&counters.left_by_policy),
            errors = ?counters.errors().into_iter().filter(|e| e.1 > 0).collect::<Vec<_>>(),
            // BPF's counters by their one name (bpf/writebehind.h), as
            // `wbctl status` shows them.
            "stopping {}",
            wb_stat::summary(|s| loaded.stat(s))
        );
        drop(loaded);
    }
}
