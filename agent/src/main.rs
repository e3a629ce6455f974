//! writebehindd: the daemon.  Runs in the foreground; SIGINT/SIGTERM detach
//! everything and exit.  One instance at a time (instance.rs).

mod instance;

use std::{io::IsTerminal, path::Path, process::ExitCode};

use clap::{CommandFactory, error::ErrorKind};
use instance::Instance;
use writebehindd::{
    daemon::{self, Daemon},
    loader,
    pacing::{self, Lever, Pacer},
    policies::{self, PolicySet},
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

/// What the command line asks for.
enum Mode {
    /// --check-policy: validate these files and directories.
    Check(Vec<std::path::PathBuf>),
    Restore,
    Run(daemon::Options),
}

/// The command line (writebehindd-cli defines it), in the daemon's types.
/// A bad argument exits with 2, --help and --version with 0.
fn parse_args() -> Mode {
    let a: cli::Args = writebehindd_cli::parse(env!("CARGO_PKG_VERSION"));
    if let Some(paths) = a.check_policy {
        return Mode::Check(paths);
    }
    if a.restore {
        return Mode::Restore;
    }
    let control_group = a.control_group.as_deref().map(|g| {
        group_id(g).unwrap_or_else(|| {
            cli::Args::command().error(ErrorKind::InvalidValue, format!("--control-group: no group {g:?}")).exit()
        })
    });
    Mode::Run(daemon::Options {
        policy_dir: a.policy_dir,
        policy_files: a.policies,
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
        observe: a.observe,
    })
}

fn main() -> ExitCode {
    let options = match parse_args() {
        Mode::Check(paths) => return check_policy(&paths),
        Mode::Restore => None,
        Mode::Run(options) => Some(options),
    };
    // Before anything reads or writes the journal, the knobs or the programs.
    let Some(_instance) = claim(options.is_none()) else {
        return ExitCode::FAILURE;
    };
    init_logging();
    let Some(options) = options else {
        restore();
        return ExitCode::SUCCESS;
    };
    let set = match daemon::load_policies(&options.policy_dir, &options.policy_files, options.observe) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("writebehindd: policy: {e:#}");
            return ExitCode::from(2);
        }
    };
    match Daemon::new(set, options).and_then(Daemon::run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("writebehindd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Events to the journal with fields of their own when stderr is its
/// stream (journal.rs), else as text on stderr.
fn init_logging() {
    use tracing_subscriber::{layer::SubscriberExt, util::SubscriberInitExt};
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let journal = writebehindd::journal::JournalLayer::if_connected();
    let text = journal.is_none().then(|| {
        tracing_subscriber::fmt::layer()
            .with_target(false)
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
    });
    tracing_subscriber::registry().with(filter).with(journal).with(text).init();
}

/// --check-policy: each file, or each directory's drop-ins, loaded as one
/// set; the effective policy per match printed.
fn check_policy(paths: &[std::path::PathBuf]) -> ExitCode {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            files.extend(policies::dir_files(p).unwrap_or_default());
        } else {
            files.push(p.clone());
        }
    }
    match PolicySet::load(&files) {
        Ok(set) => {
            print!("{}", set.describe());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("writebehindd: {e:#}");
            ExitCode::from(1)
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
