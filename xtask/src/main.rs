//! cargo xtask: the project's build, run, test and bench entry points.
//!
//!   cargo xtask run [-- ARGS]   build (release) and run the daemon in the foreground
//!   cargo xtask test            build everything, run every test (root; real BPF)
//!   cargo xtask vmtest          the tests on Debian's stock kernels under qemu (fentry backend)
//!   cargo xtask systest         the service under systemd on Debian 12 and 13, their stock kernels
//!   cargo xtask bench [--quick] measure write-behind against the alternatives
//!   cargo xtask deb [--check]   build the Debian package (and check it)

mod bench;
mod deb;
mod guest;
mod install;
mod layout;
mod systest;
mod vmtest;

use std::{
    process::{Command, ExitCode},
    time::{Duration, Instant},
};

use anyhow::{Result, bail};

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  run [-- ARGS]      build the daemon (release) and run it in the foreground as root
  test [ARGS]        build, then run all tests (needs root: they load BPF and make loop devices);
                     ARGS go to cargo test (e.g. a test name filter)
  bench [--quick]    run the benchmark scenarios side by side with the kernel default
  vmtest [--quick] [--kernel V[,V...]] [--only TEST[,TEST...]] [--backend fentry|tracepoint]
                     run the integration tests on Debian's stock kernels under qemu (TCG):
                     5.10 (Debian 11's, the oldest supported), 6.1, 6.12 and 7.2 (sid), on the
                     fentry backend and on the tracepoint backend, the differential test on the
                     oldest and the newest (--quick, which `test` runs: fewer tests, most on
                     fentry only; --only: these test binaries; --backend: this one only)
  systest [--quick] [--kernel V[,V...]] [--deb FILE|--no-deb] [--only usb|db] [--images]
                     the service under systemd (PID 1) on each stock kernel under qemu, 5.10 and
                     6.1 in a Debian 12 guest, 6.12 and 7.2 in a Debian 13 one, built with
                     mmdebstrap (cached in target/guest; --images: only build them):
                     apt install of the .deb (built first; --no-deb: debug binaries + unit
                     copied), enable --now, READY, fentry, no watchdog restart, journal,
                     kill -9, security exposure, purge; USB sticks (vfat, exFAT, ntfs3 on a
                     throttled usb-storage device: cp, cp -r, rsync, gio against the kernel
                     default, surprise removal, hotplug); without --quick, PostgreSQL's
                     pgbench on the stick beside a copy (its own image, with postgresql)
  install [--root DIR]    build (release) and install the daemon, wbctl, the systemd unit,
                          completions and docs under DIR (default /); then
                          systemctl enable --now writebehindd
  uninstall [--root DIR]  remove what install put there (policies in /etc are kept)
  deb [--check]      build target/deb/writebehindd_<version>_<arch>.deb (release); --check, which
                     `test` runs: its contents, lintian, install/upgrade/remove/purge in a throwaway root";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("run") => run(&args[1..]),
        Some("test") => test(&args[1..]),
        Some("bench") => bench::main(&args[1..]),
        Some("vmtest") => vmtest::main(&args[1..]),
        Some("systest") => systest::main(&args[1..]),
        // Run inside the vmtest guest: each backend's cost per write.
        Some("overhead") => vmtest::overhead(&args[1..]),
        Some("install") => install::install(&args[1..]),
        Some("uninstall") => install::uninstall(&args[1..]),
        Some("deb") => deb::main(&args[1..]),
        // Run by `deb --check`, in a mount namespace of its own.
        Some("deb-tryout") => deb::tryout(&args[1..]),
        // The bench's in-application writers (Linus's loop, RWF_DONTCACHE).
        Some("writer") => bench::writer::main(&args[1..]),
        Some("-h" | "--help") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(anyhow::anyhow!("unknown command {other:?}\n{USAGE}")),
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
            systest::main(&["--quick".into(), "--images".into()])
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
    // under the unit in systest), beside the host tests.
    let vmtest = if args.is_empty() { Some(vmtest::quick_beside()?) } else { None };
    let mut cmd = vec!["test", "--workspace"];
    cmd.extend(args.iter().map(String::as_str));
    // One at a time: tests measure one device's dirty pages and must not
    // disturb each other's numbers.
    cmd.extend(["--", "--test-threads=1"]);
    timed("host tests", &mut || cargo(&cmd))?;
    if let Some(vmtest) = vmtest {
        // The package: what it holds, lintian, dpkg install and purge.
        timed("deb --check", &mut || deb::main(&["--check".into()]))?;
        // The bench is not a test, but its harness is: set up the throttled
        // device, one short run per mode, tear down.
        timed("bench --smoke", &mut || bench::main(&["--smoke".into(), "--out".into(), "target/bench/smoke".into()]))?;
        // What is left of the guest's run once the host's phases are done.
        let mut vmtest = Some(vmtest);
        timed("vmtest --quick", &mut || vmtest.take().map_or(Ok(()), vmtest::Beside::finish))?;
        // The package as a service under systemd (PID 1, cgroup v2) on
        // Debian's stock 6.1, 6.12 and 7.2 (systest::QUICK_KERNELS; 5.10
        // was booted above).
        timed("systest --quick", &mut || systest::main(&["--quick".into()]))?;
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
