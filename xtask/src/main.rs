//! cargo xtask: the project's build, run, test and bench entry points.
//!
//!   cargo xtask run [-- ARGS]   build (release) and run the daemon in the foreground
//!   cargo xtask test [ARGS]     build everything, run every test (root; real BPF)
//!   cargo xtask vmtest          the tests on Debian's stock kernels under qemu (fentry backend)
//!   cargo xtask systest         the service under systemd on Debian 12 and 13, their stock kernels
//!   cargo xtask bench [--quick] measure write-behind against the alternatives
//!   cargo xtask install         build (release) and install under --root (default /); uninstall
//!   cargo xtask deb [--check]   build the Debian package (and check it)
//!   cargo xtask rpm [--check]   build the RPM (and check it with rpmlint)
//!   cargo xtask container [--check]  build the container image (and run it under podman)
//!
//! The command line and each command's help are in cli.rs; `cargo xtask
//! help COMMAND` (or COMMAND --help) prints them.

mod bench;
mod cli;
mod container;
mod deb;
mod guest;
mod install;
mod layout;
mod rpm;
mod systest;
mod vmtest;

use std::{
    process::{Command, ExitCode},
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use clap::{CommandFactory, Parser};
use cli::{Cli, Cmd};

fn main() -> ExitCode {
    // Errors in the arguments are clap's: its message, usage, exit 2.
    let cli = Cli::parse();
    let result = match &cli.command {
        Some(Cmd::Run { args }) => run(args),
        Some(Cmd::Test { args }) => test(args),
        Some(Cmd::Bench(args)) => bench::main(args),
        Some(Cmd::Vmtest(args)) => vmtest::main(args),
        Some(Cmd::Systest(args)) => systest::main(args),
        Some(Cmd::Install(args)) => install::install(args),
        Some(Cmd::Uninstall(args)) => install::uninstall(args),
        Some(Cmd::Deb(args)) => deb::main(args),
        Some(Cmd::Rpm(args)) => rpm::main(args),
        Some(Cmd::Container(args)) => container::main(args),
        Some(Cmd::Overhead { args }) => vmtest::overhead(args),
        Some(Cmd::DebTryout { args }) => deb::tryout(args),
        Some(Cmd::Writer { args }) => bench::writer::main(args),
        None => Cli::command().print_help().map_err(Into::into),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

pub fn cargo(args: &[&str]) -> Result<()> {
    let status = Command::new(env!("CARGO")).args(args).status()?;
    if !status.success() {
        bail!("cargo {} failed", args.join(" "));
    }
    Ok(())
}

/// A release binary of the workspace, wherever cargo puts them.
pub fn release_bin(name: &str) -> std::path::PathBuf {
    let dir = std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into());
    std::path::Path::new(&dir).join("release").join(name)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn run(args: &[String]) -> Result<()> {
    cargo(&["build", "--release", "-p", "writebehindd"])?;
    let args: Vec<&str> = args.iter().map(String::as_str).skip_while(|a| *a == "--").collect();
    let status = Command::new(release_bin("writebehindd")).args(&args).status()?;
    if !status.success() {
        bail!("writebehindd exited with {status}");
    }
    Ok(())
}

fn test(args: &[String]) -> Result<()> {
    // First, as it takes a second and needs neither root nor a build: the
    // tree must not cite its own work history by number (a work session's,
    // an issue's), which no reader can look up.
    let check = concat!(env!("CARGO_MANIFEST_DIR"), "/../.ci/no-history");
    if !Command::new(check).status()?.success() {
        bail!("{check} found references to the work's history");
    }
    if !is_root() {
        bail!("the tests load BPF programs and create loop devices: run them as root");
    }
    let mut phases = Vec::new();
    let result = test_phases(args, &mut phases);
    // Printed whatever the outcome: CI's run takes most of an hour, and a
    // failed one should still say what ran before it and for how long.
    println!("\nxtask test: phase times");
    for (name, took, ok) in &phases {
        println!("  {name:<16} {:>6}{}", min_sec(*took), if *ok { "" } else { "  FAILED" });
    }
    println!("  {:<16} {:>6}", "total", min_sec(phases.iter().map(|p| p.1).sum()));
    result
}

/// A phase of `test`: its name, how long it took, whether it passed.
type Phase = (&'static str, Duration, bool);

fn test_phases(args: &[String], phases: &mut Vec<Phase>) -> Result<()> {
    let mut timed = |name, f: &mut dyn FnMut() -> Result<()>| {
        let started = Instant::now();
        let result = f();
        phases.push((name, started.elapsed(), result.is_ok()));
        result
    };
    // The guests' images and kernels are made while the binaries build:
    // mmdebstrap waits on the archive and on dpkg for much of its 4 minutes.
    // Joined before the host tests, whose figures it would disturb.
    let guests = args.is_empty().then(|| {
        std::thread::spawn(|| -> Result<()> {
            vmtest::prepare_quick()?;
            systest::main(&systest::Args { quick: true, images: true, ..Default::default() })
        })
    });
    // Integration tests spawn the daemon binary, so build it first.
    timed("build", &mut || cargo(&["build", "--workspace", "--bins"]))?;
    if let Some(guests) = guests {
        // What the phases after it build, built beside the guests: the test
        // binaries, and the release build (the package's and the bench's).
        timed("build (tests, release)", &mut || {
            cargo(&["test", "--workspace", "--no-run"])?;
            cargo(&["build", "--release", "-p", "writebehindd"])
        })?;
        let mut guests = Some(guests);
        timed("guest images", &mut || joined(&mut guests, "preparing the guests"))?;
    }
    // This kernel refuses fentry: the fentry backend is tested on Debian's
    // stock kernels under emulation, the oldest here (the newest runs it
    // under the unit in systest), beside the host tests; once it is done,
    // systest's guests of systest::QUICK_BESIDE, from the package built
    // now (`cargo test` holds the build directory's lock until it ends).
    let beside = if args.is_empty() {
        let vmtest = vmtest::quick_beside()?;
        let deb = deb::package()?;
        // Its package, sources and disk written now: the host tests' daemons
        // would stream (and pace the root disk for) a writer beside them.
        let systest = systest::prepare(&systest::Args {
            quick: true,
            kernel: Some(systest::QUICK_BESIDE.to_vec()),
            deb: Some(deb),
            beside: true,
            ..Default::default()
        })?;
        Some(std::thread::spawn(move || {
            let vm = vmtest.wait();
            let sys = systest.map_or(Ok(()), systest::Prepared::boot);
            (vm, sys)
        }))
    } else {
        None
    };
    let mut cmd = vec!["test", "--workspace"];
    cmd.extend(args.iter().map(String::as_str));
    // One at a time: tests measure one device's dirty pages and must not
    // disturb each other's numbers.
    cmd.extend(["--", "--test-threads=1"]);
    timed("host tests", &mut || cargo(&cmd))?;
    if let Some(beside) = beside {
        // The package: what it holds, lintian, dpkg install and purge.
        timed("deb --check", &mut || deb::main(&deb::Args { check: true }))?;
        // The RPM (rpmlint), and the image under podman with the
        // DaemonSet's grant: a host copy paced, a real Prometheus's scrape
        // and the dashboard's queries, the knobs after stop and kill
        // (about 16 s and 13-40 s here).
        timed("rpm --check", &mut || rpm::main(&rpm::Args { check: true }))?;
        timed("container --check", &mut || container::main(&container::Args { check: true, global_lever: false }))?;
        // The bench is not a test, but its harness is: set up the throttled
        // device, one short run per mode, tear down.
        let smoke = bench::Args { smoke: true, out: Some("target/bench/smoke".into()), ..Default::default() };
        timed("bench --smoke", &mut || bench::main(&smoke))?;
        // What is left of the guests' run beside once the host's phases
        // are done: vmtest's console, then the systest guest's outcome.
        let mut beside = Some(beside);
        timed("guests beside", &mut || {
            let Some(lane) = beside.take() else { return Ok(()) };
            let ((lines, vm), sys) = lane.join().map_err(|_| anyhow::anyhow!("the guests beside panicked"))?;
            vmtest::print(&lines);
            vm.and(sys)
        })?;
        // The package as a service under systemd (PID 1, cgroup v2) on
        // Debian's stock 6.1 and 7.2 (systest::QUICK_KERNELS but those
        // booted beside; 5.10 was booted above).
        let rest = systest::quick_after_host_tests();
        timed("systest --quick", &mut || {
            systest::main(&systest::Args { quick: true, kernel: Some(rest.clone()), ..Default::default() })
        })?;
    }
    Ok(())
}

/// What a phase run in its own thread returned, once it ends (a second
/// call finds nothing to wait for).
fn joined(thread: &mut Option<std::thread::JoinHandle<Result<()>>>, what: &str) -> Result<()> {
    match thread.take().map(|t| t.join()) {
        Some(Ok(result)) => result,
        Some(Err(_)) => bail!("{what} panicked"),
        None => Ok(()),
    }
}

fn min_sec(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}:{:02}", s / 60, s % 60)
}
