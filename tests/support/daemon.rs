//! The real writebehindd binary, started for a test and stopped after it.

use std::{
    fs::File,
    io::Read,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{Scratch, bin_dir};

/// How a test starts the daemon; every field has a default.
#[derive(Default)]
struct Launch<'a> {
    /// A command the daemon runs under (setpriv ... --).
    wrapper: &'a [&'a str],
    /// Default: the binary this workspace built.
    exe: Option<&'a Path>,
    /// A policy file's text, given after the (empty) policy directory.
    policy: Option<&'a str>,
    args: &'a [&'a str],
    /// RUST_LOG; default WB_TEST_LOG or "info".
    log_filter: Option<&'a str>,
    /// More environment (WB_BPF_OBJECT=compat).
    env: &'a [(&'a str, &'a str)],
}

pub struct Daemon {
    child: Child,
    log: PathBuf,
    _scratch: Scratch,
}

impl Daemon {
    /// Starts the daemon this workspace built and waits until it is attached.
    pub fn start() -> Result<Self> {
        Self::spawn(Launch::default())
    }

    /// A given binary, with a policy file of the given text if any.
    pub fn start_exe(exe: &Path, policy: Option<&str>) -> Result<Self> {
        Self::spawn(Launch { exe: Some(exe), policy, ..Launch::default() })
    }

    /// A given binary with arguments.
    pub fn start_exe_with_args(exe: &Path, args: &[&str]) -> Result<Self> {
        Self::spawn(Launch { exe: Some(exe), args, ..Launch::default() })
    }

    /// A given binary with a policy file of the given text, if any, and arguments.
    pub fn start_exe_with(exe: &Path, policy: Option<&str>, args: &[&str]) -> Result<Self> {
        Self::spawn(Launch { exe: Some(exe), policy, args, ..Launch::default() })
    }

    /// With more command-line arguments.
    pub fn start_with_args(args: &[&str]) -> Result<Self> {
        Self::spawn(Launch { args, ..Launch::default() })
    }

    /// With a policy file of the given text instead of the embedded default.
    pub fn start_with_policy(policy: &str) -> Result<Self> {
        Self::spawn(Launch { policy: Some(policy), ..Launch::default() })
    }

    /// With a policy file and more environment (NOTIFY_SOCKET, to hear its
    /// watchdog pings).
    pub fn start_with_env(policy: &str, env: &[(&str, &str)]) -> Result<Self> {
        Self::spawn(Launch { policy: Some(policy), env, ..Launch::default() })
    }

    /// With a policy, arguments and environment, logging every event it
    /// receives.
    pub fn start_traced(policy: &str, args: &[&str], env: &[(&str, &str)]) -> Result<Self> {
        Self::spawn(Launch {
            policy: Some(policy),
            args,
            log_filter: Some("info,writebehindd::streams=debug"),
            env,
            ..Launch::default()
        })
    }

    /// Run through `wrapper` (e.g. setpriv with its options, ending in --).
    pub fn start_wrapped(wrapper: &[&str], policy: Option<&str>) -> Result<Self> {
        Self::spawn(Launch { wrapper, policy, ..Launch::default() })
    }

    fn spawn(l: Launch) -> Result<Self> {
        let Launch { wrapper, exe, policy, args, log_filter, env } = l;
        let default_exe = daemon_exe();
        let exe = exe.unwrap_or(&default_exe);
        if !exe.exists() {
            bail!("{} is not built: run `cargo xtask test`, which builds it first", exe.display());
        }
        let scratch = Scratch::new("daemon")?;
        let log = scratch.0.join("daemon.log");
        let mut cmd = match wrapper.split_first() {
            Some((w, wargs)) => {
                let mut c = Command::new(w);
                c.args(wargs).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        // Never the host's /etc/writebehindd/policies.d: an empty directory,
        // and the test's policy (if any) as one file after it.
        let dir = scratch.0.join("policies.d");
        std::fs::create_dir_all(&dir)?;
        cmd.arg("--policy-dir").arg(&dir);
        // Its own control socket: never the host daemon's.
        cmd.arg("--control").arg(scratch.0.join("control.sock"));
        // WB_TEST_BACKEND=fentry|tracepoint (cargo xtask vmtest runs each).
        if let (Ok(b), false) = (std::env::var("WB_TEST_BACKEND"), args.contains(&"--backend")) {
            cmd.arg("--backend").arg(b);
        }
        cmd.args(args);
        if let Some(text) = policy {
            let file = scratch.0.join("policy.toml");
            std::fs::write(&file, text)?;
            cmd.arg("--policy").arg(file);
        }
        let child = cmd
            .envs(env.iter().copied())
            .env(
                "RUST_LOG",
                log_filter.map(String::from).or_else(|| std::env::var("WB_TEST_LOG").ok()).unwrap_or("info".into()),
            )
            .stdin(Stdio::null())
            .stdout(File::create(&log)?)
            .stderr(File::create(&log)?)
            .spawn()?;
        let mut d = Self { child, log, _scratch: scratch };
        d.wait_log("attached", attach_within())?;
        Ok(d)
    }

    /// Waits until the log contains `want`; returns the log.  Fails if the
    /// daemon exits first or `within` passes.
    pub fn wait_log(&mut self, want: &str, within: Duration) -> Result<String> {
        let deadline = Instant::now() + within;
        loop {
            let log = self.log_text();
            if log.contains(want) {
                return Ok(log);
            }
            if let Some(st) = self.child.try_wait()? {
                bail!("writebehindd exited ({st}) before logging {want:?}:\n{log}");
            }
            if Instant::now() > deadline {
                bail!("no {want:?} in the daemon log within {within:?}:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The policy file given with start_with_policy (rewrite it, then reload).
    pub fn policy_file(&self) -> PathBuf {
        self._scratch.0.join("policy.toml")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The daemon's control socket.
    pub fn socket(&self) -> PathBuf {
        self._scratch.0.join("control.sock")
    }

    /// `wbctl` talking to this daemon's control socket.
    pub fn wbctl(&self) -> std::process::Command {
        let mut c = std::process::Command::new(bin_dir().join("wbctl"));
        c.arg("--socket").arg(self.socket());
        c
    }

    /// A counter as `wbctl status` shows it now ("counters: key=N ...").
    pub fn counter(&self, key: &str) -> Result<u64> {
        let out = self.wbctl().arg("status").output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .filter_map(|l| l.strip_prefix("counters:"))
            .find_map(|l| log_field(l, key)?.parse().ok())
            .with_context(|| {
                format!("no {key} in wbctl status ({}):\n{text}{}", out.status, String::from_utf8_lossy(&out.stderr))
            })
    }

    /// SIGTERM, without waiting for the daemon to exit (`stop` waits).
    pub fn signal_stop(&self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }

    /// SIGHUP: re-read the policies.
    pub fn reload(&self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGHUP) };
    }

    pub fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// SIGTERM, then wait; returns the log.  The daemon must exit cleanly.
    /// With WB_DAEMON_LOG=FILE set, the log is also appended there.
    pub fn stop(mut self) -> Result<String> {
        let status = self.terminate()?;
        let log = self.log_text();
        if let Ok(keep) = std::env::var("WB_DAEMON_LOG") {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(keep)?;
            writeln!(f, "{log}")?;
        }
        if !status.success() {
            bail!("writebehindd exited with {status}:\n{log}");
        }
        Ok(log)
    }

    /// Waits for the daemon to exit by itself (e.g. killed by a fault
    /// injected under a wrapper); fails if it still runs after `within`.
    pub fn wait_exit(&mut self, within: Duration) -> Result<ExitStatus> {
        match wait_child(&mut self.child, within)? {
            Some(st) => Ok(st),
            None => bail!("writebehindd still running after {within:?}:\n{}", self.log_text()),
        }
    }

    /// Its exit status if it has already exited by itself.
    pub fn exited(&mut self) -> Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// SIGKILL: the daemon gets no chance to clean up (a crash).
    pub fn kill(mut self) -> Result<String> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(self.log_text())
    }

    /// SIGKILL without waiting for the exit, which a thread stuck in the
    /// kernel can hold up for as long as it stays stuck.
    pub fn sigkill(&self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
    }

    fn terminate(&mut self) -> Result<std::process::ExitStatus> {
        if let Some(st) = self.child.try_wait()? {
            return Ok(st);
        }
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(st);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                bail!("writebehindd ignored SIGTERM for 20 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.terminate();
            if std::thread::panicking() {
                eprintln!("--- writebehindd log ---\n{}", self.log_text());
            }
        }
    }
}

/// Runs the built writebehindd with `args` as a command that ends by itself
/// (`--restore`, a second instance that must refuse); its exit status and
/// output (stdout and stderr).  Killed, and an error, if it still runs after
/// `within`.
pub fn run_writebehindd(args: &[&str], within: Duration) -> Result<(ExitStatus, String)> {
    let scratch = Scratch::new("run")?;
    let out = scratch.0.join("out");
    let mut child = Command::new(daemon_exe())
        .args(args)
        .stdin(Stdio::null())
        .stdout(File::create(&out)?)
        .stderr(File::create(&out)?)
        .spawn()?;
    let status = wait_child(&mut child, within)?;
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    match status {
        Some(st) => Ok((st, text)),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            bail!("writebehindd {args:?} still running after {within:?}:\n{text}")
        }
    }
}

/// The child's exit status, or None if it still runs after `within`.
pub fn wait_child(child: &mut Child, within: Duration) -> Result<Option<ExitStatus>> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(Some(st));
        }
        if Instant::now() > deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The daemon binary tests run: this workspace's, or WB_TEST_DAEMON (another
/// build, e.g. to show that a new test fails on the old code).
pub fn daemon_exe() -> PathBuf {
    std::env::var_os("WB_TEST_DAEMON").map_or_else(|| bin_dir().join("writebehindd"), PathBuf::from)
}

/// The value of `key=value` in a daemon log line.
pub fn log_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// A counter from the "stopping" line a daemon log ends with (`key=N`).
pub fn stopped_counter(log: &str, key: &str) -> u64 {
    log.lines()
        .filter(|l| l.contains("stopping"))
        .find_map(|l| log_field(l, key)?.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in the stopping line:\n{log}"))
}

/// How long a start may take to attach.  Under emulation (WB_TEST_SCALE)
/// at idle priority, beside the host tests, 5.10's verifier alone once took
/// longer than 20 s (works_in_the_units_namespace, in CI's vmtest).
fn attach_within() -> Duration {
    Duration::from_secs(if super::scale() > 1 { 90 } else { 20 })
}
