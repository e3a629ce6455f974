//! writebehindd: the daemon.  Runs in the foreground; SIGINT/SIGTERM detach
//! everything and exit.

use std::{io::IsTerminal, process::ExitCode, sync::Arc};

use anyhow::Result;
use tokio::signal::unix::{SignalKind, signal};
use writebehindd::{
    abi::wb_stat,
    counters::Counters,
    devices::Devices,
    intake,
    loader::{self, Loaded},
    pacing::Pacer,
    policy::Policy,
    streams::StreamTable,
};

const USAGE: &str = "\
usage: writebehindd [--policy FILE] [--help] [--version]

Keeps the dirty page cache of streaming writers near a small window by
starting writeback behind them. Runs in the foreground until SIGINT/SIGTERM.

  --policy FILE   use this policy instead of the embedded default
                  (policies/default.toml documents every key)

Log level: RUST_LOG (default info).";

fn main() -> ExitCode {
    let mut policy_file = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            "-V" | "--version" => {
                println!("writebehindd {}", env!("CARGO_PKG_VERSION"));
                return ExitCode::SUCCESS;
            }
            "--policy" => match args.next() {
                Some(f) => policy_file = Some(f),
                None => {
                    eprintln!("writebehindd: --policy needs a file\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            other => {
                eprintln!("writebehindd: unknown argument {other:?}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let policy = match policy_file {
        None => Policy::embedded_default(),
        Some(f) => match std::fs::read_to_string(&f).map_err(anyhow::Error::from).and_then(|t| Policy::parse(&t)) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("writebehindd: policy {f}: {e:#}");
                return ExitCode::from(2);
            }
        },
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    match run(policy) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("writebehindd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(policy: Policy) -> Result<()> {
    loader::check_environment()?;
    // Before anything is attached: put back bdi limits a killed run left.
    let pacer = Pacer::new();
    let mut loaded = Loaded::load_and_attach(policy.bpf_config(false))?;
    let events = loaded.take_events()?;
    let tuning = loaded.take_tuning()?;
    tracing::info!(
        window = ?policy.window, burst = policy.burst.0, pacing = policy.pacing, backend = "tracepoint",
        "attached; watching for streaming writers"
    );

    let counters = Arc::new(Counters::default());
    let mut table = StreamTable::new(counters.clone(), Devices::new(policy, Some(tuning), pacer));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let shutdown = async {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        };
        intake::run(&loaded, events, &mut table, shutdown).await
    })?;

    table.shutdown();
    tracing::info!(
        events = Counters::get(&counters.events),
        streams = Counters::get(&counters.streams_started),
        spans_flushed = Counters::get(&counters.spans_flushed),
        bytes_flushed = Counters::get(&counters.bytes_flushed),
        closed_files_flushed = Counters::get(&counters.closed_files_flushed),
        rb_drops = loaded.stat(wb_stat::WB_STAT_RB_DROPS),
        untracked_map_full = loaded.stat(wb_stat::WB_STAT_MAP_FULL),
        errors = ?counters.errors().into_iter().filter(|e| e.1 > 0).collect::<Vec<_>>(),
        "stopping"
    );
    drop(loaded);
    Ok(())
}
