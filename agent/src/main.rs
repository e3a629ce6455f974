//! writebehindd: the daemon.  Runs in the foreground; SIGINT/SIGTERM detach
//! everything and exit.  One instance at a time (instance.rs).

mod instance;

use std::{
    io::IsTerminal,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{Arc, Mutex},
    time::Instant,
};

use anyhow::{Context, Result};
use clap::{CommandFactory, error::ErrorKind};
use instance::Instance;
use tokio::signal::unix::{SignalKind, signal};
use writebehindd::{
    abi::{wb_config, wb_stat},
    cgroups::CgroupPolicies,
    control::{self, Shared},
    counters::Counters,
    devices::Devices,
    intake,
    loader::{self, Loaded},
    pacing::{self, Lever, Pacer},
    policies::{self, PolicySet},
    streams::StreamTable,
};
use writebehindd_cli::daemon as cli;

/// A group's id from its name (or a number).
fn group_id(g: &str) -> Option<u32> {
    if let Ok(n) = g.parse() {
        return Some(n);
    }
    let name = std::ffi::CString::new(g).ok()?;
    let gr = unsafe { libc::getgrnam(name.as_ptr()) };
    (!gr.is_null()).then(|| unsafe { (*gr).gr_gid })
}

struct Args {
    dir: PathBuf,
    files: Vec<PathBuf>,
    check: Option<Vec<PathBuf>>,
    restore: bool,
    control: PathBuf,
    control_group: Option<u32>,
    metrics_listen: Option<std::net::SocketAddr>,
    backend: loader::Backend,
    lever: Lever,
    max_streams: usize,
}

/// The command line (writebehindd-cli defines it), in the daemon's types.
/// A bad argument exits with 2, --help and --version with 0.
fn parse_args() -> Args {
    let a: cli::Args = writebehindd_cli::parse(env!("CARGO_PKG_VERSION"));
    let control_group = a.control_group.as_deref().map(|g| {
        group_id(g).unwrap_or_else(|| {
            cli::Args::command().error(ErrorKind::InvalidValue, format!("--control-group: no group {g:?}")).exit()
        })
    });
    Args {
        dir: a.policy_dir,
        files: a.policies,
        check: a.check_policy,
        restore: a.restore,
        control: a.control,
        control_group,
        metrics_listen: a.metrics_listen,
        backend: match a.backend {
            cli::Backend::Auto => loader::Backend::Auto,
            cli::Backend::Fentry => loader::Backend::Fentry,
            cli::Backend::Tracepoint => loader::Backend::Tracepoint,
        },
        lever: match a.pacing_lever {
            cli::Lever::Auto => Lever::Auto,
            cli::Lever::Bdi => Lever::Bdi,
            cli::Lever::Global => Lever::Global,
        },
        max_streams: a.max_streams,
    }
}

/// The policies of a run: the directory's files, then the --policy ones.
/// Read at start and again at each reload.
fn load_policies(dir: &Path, extra: &[PathBuf]) -> Result<PolicySet> {
    let mut files = policies::dir_files(dir)?;
    files.extend(extra.iter().cloned());
    PolicySet::load(&files)
}

fn main() -> ExitCode {
    let args = parse_args();
    if let Some(paths) = &args.check {
        let mut files = Vec::new();
        for p in paths {
            if p.is_dir() {
                files.extend(policies::dir_files(p).unwrap_or_default());
            } else {
                files.push(p.clone());
            }
        }
        return match PolicySet::load(&files) {
            Ok(set) => {
                print!("{}", set.describe());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("writebehindd: {e:#}");
                ExitCode::from(1)
            }
        };
    }
    // Before anything reads or writes the journal, the knobs or the programs.
    let Some(_instance) = claim(args.restore) else {
        return ExitCode::FAILURE;
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    if args.restore {
        restore();
        return ExitCode::SUCCESS;
    }
    let set = match load_policies(&args.dir, &args.files) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("writebehindd: policy: {e:#}");
            return ExitCode::from(2);
        }
    };
    match run(set, args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("writebehindd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// This process as the only one acting on the knobs and the journal, until
/// it exits; or None, having said why not.
fn claim(restore: bool) -> Option<Instance> {
    // Refusals that change nothing come first: without root the lock's
    // directory is out of reach, and the error would not say why.
    let checked = if !restore {
        loader::check_environment()
    } else if !writebehindd::sys::is_root() {
        Err(anyhow::anyhow!("--restore must run as root: it writes bdi settings"))
    } else {
        Ok(())
    };
    match checked.and_then(|()| Instance::claim(Path::new(instance::LOCK))) {
        Ok(instance) => Some(instance),
        Err(e) if !e.is::<instance::Running>() => {
            eprintln!("writebehindd: {e:#}");
            None
        }
        Err(e) if restore => {
            eprintln!("writebehindd --restore: refused: {e}; it restores the bdi limits itself when it stops");
            None
        }
        Err(e) => {
            eprintln!("writebehindd: not starting a second instance: {e}");
            None
        }
    }
}

/// `--restore`: after a daemon was killed (systemd's SIGKILL at its stop
/// timeout; the unit's ExecStopPost runs this), the recovery every start
/// runs, without starting.
fn restore() {
    match Pacer::new(Lever::Auto).recovered() {
        0 => {
            tracing::info!(journals = %format!("{} {}", pacing::JOURNAL, pacing::global::JOURNAL), "nothing to restore")
        }
        sets => tracing::info!(sets, "limits a killed daemon left journaled: restored where it had set them"),
    }
}

fn run(set: PolicySet, args: Args) -> Result<()> {
    // Signals first: a SIGTERM that arrives while the programs are being
    // attached must stop the daemon cleanly (restoring what it changed),
    // not kill it with the default action.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (mut term, mut int, mut hup) = {
        let _in_runtime = rt.enter();
        (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?, signal(SignalKind::hangup())?)
    };
    // A held file and a pidfd per stream, flush-time handles, clients.
    let want = 2 * args.max_streams as u64 + 1024;
    let nofile = writebehindd::sys::raise_nofile(want);
    if nofile < want {
        tracing::warn!(nofile, want, "RLIMIT_NOFILE is low: streams beyond it are left to the kernel");
    }
    // Before anything is attached: put back bdi limits a killed run left
    // (as --restore does).
    let pacer = Pacer::new(args.lever);
    let root = set.root().clone();
    let cfg = wb_config { dflt: root.to_bpf(), ..Default::default() };
    let mut loaded = Loaded::load_and_attach(cfg, args.backend)?;
    let events = loaded.take_events()?;
    let (config, devices, cgroup_map) = loaded.take_tuning()?;
    let shares = loaded.take_shares()?;
    // Bound before "attached" is logged: whoever waits for that line (the
    // tests, the bench) may connect at once.  The other way round, the
    // bench's smoke run once found no socket there.
    let (server, listener) = control::Server::bind(&args.control)?;
    tracing::info!(
        window = ?root.window, burst = root.burst.0, pacing = root.pacing, backend = %loaded.backend,
        policies = %set.sources.join(", "), "attached; watching for streaming writers"
    );
    let mut cgroups = CgroupPolicies::new(set, config, cgroup_map);

    let metrics_listener = match args.metrics_listen {
        None => None,
        Some(addr) => {
            if !addr.ip().is_loopback() {
                tracing::warn!(%addr, "metrics served beyond loopback: anyone who can reach it reads them");
            }
            let l = std::net::TcpListener::bind(addr).with_context(|| format!("--metrics-listen {addr}"))?;
            l.set_nonblocking(true)?;
            tracing::info!(%addr, "serving OpenMetrics at /metrics");
            Some(l)
        }
    };
    let counters = Arc::new(Counters::default());
    let shared = Arc::new(Mutex::new(Shared { status: Default::default(), policies: cgroups.set().clone() }));
    let (cmd_tx, cmd_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut ctl = intake::Control {
        shared: shared.clone(),
        commands: cmd_rx,
        counters: counters.clone(),
        started: Instant::now(),
        backend: loaded.backend.clone(),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().into(),
    };
    let mut table = StreamTable::new(counters.clone(), Devices::new(root, Some(devices), pacer), args.max_streams);
    rt.block_on(async {
        let _server = server;
        if let Some(l) = metrics_listener {
            tokio::spawn(control::serve_metrics(l, shared.clone()));
        }
        tokio::spawn(control::serve(listener, shared, cmd_tx, args.control_group));
        writebehindd::sys::notify("READY=1");
        let reload = || match load_policies(&args.dir, &args.files) {
            Ok(set) => Some(set),
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "policy reload rejected; the running policy stays");
                None
            }
        };
        let shutdown = async {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        };
        intake::run(&loaded, events, &mut table, &mut cgroups, &shares, &mut hup, reload, &mut ctl, shutdown).await
    })?;

    table.shutdown();
    tracing::info!(
        events = Counters::get(&counters.events),
        streams = Counters::get(&counters.streams_started),
        spans_flushed = Counters::get(&counters.spans_flushed),
        bytes_flushed = Counters::get(&counters.bytes_flushed),
        closed_files_flushed = Counters::get(&counters.closed_files_flushed),
        closed_files_left = Counters::get(&counters.closed_files_left),
        closes_shed_late = Counters::get(&counters.closes_shed_late),
        rb_drops = loaded.stat(wb_stat::WB_STAT_RB_DROPS),
        untracked_map_full = loaded.stat(wb_stat::WB_STAT_MAP_FULL),
        closes_shed = loaded.stat(wb_stat::WB_STAT_CLOSES_SHED),
        left_self_synced = loaded.stat(wb_stat::WB_STAT_SELF_SYNCED),
        untracked_user_share = loaded.stat(wb_stat::WB_STAT_USER_SHARE),
        errors = ?counters.errors().into_iter().filter(|e| e.1 > 0).collect::<Vec<_>>(),
        "stopping"
    );
    drop(loaded);
    Ok(())
}
