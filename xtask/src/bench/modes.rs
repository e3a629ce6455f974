//! The alternatives a user would pick instead of writebehindd, each set up
//! for a run and undone after it (knobs restore on drop, even on error).

use std::path::Path;

use anyhow::Result;
use wb_tests::{Daemon, Knob, knob};

use super::writer::Flavor;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Kernel defaults: dirty_ratio 20 %, background 10 %.
    Default,
    /// Chinner's proposal: global dirty_background_bytes 100 MB, dirty_bytes 200 MB.
    GlobalDirty,
    /// Per-device strict_limit with max_bytes of about 1 s of bandwidth.
    BdiStrict,
    /// Linus's loop in the writer: WRITE chunk n, then wait on chunk n-1 (8 MiB).
    Linus,
    /// The writer uses pwritev2(RWF_DONTCACHE) (Linux 6.14+).
    DontCache,
    /// writebehindd with its embedded default policy, or with some keys
    /// changed ("window_seconds=0.25+pacing=false"): the curve of a setting.
    Writebehindd(Option<&'static str>),
}

pub const ALL: [Mode; 6] =
    [Mode::Default, Mode::GlobalDirty, Mode::BdiStrict, Mode::Linus, Mode::DontCache, Mode::Writebehindd(None)];

impl Mode {
    pub fn name(self) -> String {
        match self {
            Mode::Writebehindd(Some(keys)) => format!("writebehindd {keys}"),
            other => other.title().into(),
        }
    }

    fn title(self) -> &'static str {
        match self {
            Mode::Default => "kernel default",
            Mode::GlobalDirty => "global dirty_bytes",
            Mode::BdiStrict => "bdi strict_limit",
            Mode::Linus => "Linus loop",
            Mode::DontCache => "RWF_DONTCACHE",
            Mode::Writebehindd(_) => "writebehindd",
        }
    }

    pub fn key(self) -> &'static str {
        match self {
            Mode::Default => "default",
            Mode::GlobalDirty => "global",
            Mode::BdiStrict => "strict",
            Mode::Linus => "linus",
            Mode::DontCache => "dontcache",
            Mode::Writebehindd(_) => "writebehindd",
        }
    }

    /// "linus", "writebehindd", "writebehindd:window_seconds=0.25+pacing=false"
    pub fn parse(s: &str) -> Option<Mode> {
        if let Some(keys) = s.strip_prefix("writebehindd:") {
            return Some(Mode::Writebehindd(Some(Box::leak(keys.to_owned().into_boxed_str()))));
        }
        ALL.into_iter().find(|m| m.key() == s)
    }

    /// The policy file for a writebehindd variant: key=value pairs, each
    /// value a TOML literal (0.25, false, "8MiB").
    fn policy(self) -> Option<String> {
        match self {
            Mode::Writebehindd(Some(keys)) => {
                Some(keys.split('+').map(|kv| kv.replacen('=', " = ", 1) + "\n").collect())
            }
            _ => None,
        }
    }

    /// How the bench's own writers write in this mode; other modes use the
    /// real programs (cp, dd, tar) unchanged.
    pub fn flavor(self) -> Option<Flavor> {
        match self {
            Mode::Linus => Some(Flavor::Linus),
            Mode::DontCache => Some(Flavor::DontCache),
            _ => None,
        }
    }
}

/// A mode in force; dropping it restores the machine.
pub struct Active {
    _knobs: Vec<Knob>,
    daemon: Option<Daemon>,
}

impl Active {
    /// The daemon of a writebehindd mode: its pid and socket, for what it costs.
    pub fn daemon(&self) -> Option<&Daemon> {
        self.daemon.as_ref()
    }

    pub fn stop(mut self) -> Result<()> {
        if let Some(d) = self.daemon.take() {
            d.stop()?;
        }
        Ok(())
    }
}

/// vm.dirty_*_bytes and vm.dirty_*_ratio exclude each other: setting bytes
/// zeroes the ratio, so the undo of a bytes knob is the old ratio.
fn vm_bytes(name: &str, value: u64) -> Result<Knob> {
    let bytes = format!("/proc/sys/vm/{name}_bytes");
    let ratio = format!("/proc/sys/vm/{name}_ratio");
    let old_bytes = knob::read(&bytes)?;
    let (restore_path, restore) =
        if old_bytes == "0" { (ratio.clone(), knob::read(&ratio)?) } else { (bytes.clone(), old_bytes) };
    Knob::set_restoring(&bytes, &value.to_string(), &restore_path, &restore)
}

pub fn activate(mode: Mode, bdi: &str, rate: u64, daemon_exe: &Path) -> Result<Active> {
    activate_with(mode, bdi, rate, daemon_exe, None, &[])
}

/// With `[[policy]]` tables for the daemon after the mode's own keys (the
/// db scenario's `mode = "off"` for the database's cgroup), and arguments
/// for it (the beside scenario's `--pacing-lever global`).
pub fn activate_with(
    mode: Mode,
    bdi: &str,
    rate: u64,
    daemon_exe: &Path,
    tables: Option<&str>,
    args: &[&str],
) -> Result<Active> {
    let mut knobs = Vec::new();
    let mut daemon = None;
    match mode {
        Mode::GlobalDirty => {
            knobs.push(vm_bytes("dirty_background", 100_000_000)?);
            knobs.push(vm_bytes("dirty", 200_000_000)?);
        }
        Mode::BdiStrict => {
            let dir = format!("/sys/class/bdi/{bdi}");
            // Writing max_bytes rewrites max_ratio; the undo is the old ratio.
            let ratio = knob::read(&format!("{dir}/max_ratio"))?;
            knobs.push(Knob::set_restoring(
                &format!("{dir}/max_bytes"),
                &rate.to_string(),
                &format!("{dir}/max_ratio"),
                &ratio,
            )?);
            knobs.push(Knob::set(&format!("{dir}/strict_limit"), "1")?);
        }
        Mode::Writebehindd(_) => {
            // TOML: the keys at the top, the tables after them.
            let policy = match (mode.policy(), tables) {
                (keys, Some(t)) => Some(keys.unwrap_or_default() + t),
                (keys, None) => keys,
            };
            daemon = Some(Daemon::start_exe_with(daemon_exe, policy.as_deref(), args)?)
        }
        Mode::Default | Mode::Linus | Mode::DontCache => {}
    }
    Ok(Active { _knobs: knobs, daemon })
}

/// The lock every writebehindd holds for its whole life and writes its pid
/// into (agent/src/instance.rs).
const INSTANCE_LOCK: &str = "/run/writebehindd/lock";

/// Whether some process holds the instance lock now: read from /proc/locks,
/// since taking the lock to look would refuse a daemon starting meanwhile.
fn daemon_running() -> Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(INSTANCE_LOCK) else { return Ok(false) };
    let (major, minor) = (libc::major(meta.dev()), libc::minor(meta.dev()));
    let id = format!("{major:02x}:{minor:02x}:{}", meta.ino());
    Ok(std::fs::read_to_string("/proc/locks")?.lines().any(|l| l.split_whitespace().any(|f| f == id)))
}

/// The lock file as a run started: a daemon that starts writes its pid into
/// it (a takeover renames a new file over it), so a daemon that came and went
/// during the run changed it.
#[derive(PartialEq)]
pub struct LockSeen(Option<(i64, i64, u64, String)>);

impl LockSeen {
    pub fn now() -> Self {
        use std::os::unix::fs::MetadataExt;
        Self(
            std::fs::metadata(INSTANCE_LOCK).ok().map(|m| {
                (m.mtime(), m.mtime_nsec(), m.ino(), std::fs::read_to_string(INSTANCE_LOCK).unwrap_or_default())
            }),
        )
    }
}

/// Waits until no writebehindd runs on the machine: another engineer's test
/// starting one beside the bench (seen here: a hardening test in a loop)
/// refuses the bench's own daemon and watches the kernel default's runs.
/// Up to 20 minutes, then fails.
pub fn wait_alone() -> Result<()> {
    let t = std::time::Instant::now();
    let mut said = false;
    while daemon_running()? {
        if !said {
            println!("(another writebehindd holds {INSTANCE_LOCK}: waiting for it to stop)");
            said = true;
        }
        if t.elapsed().as_secs() > 1200 {
            anyhow::bail!("another writebehindd held {INSTANCE_LOCK} for 20 minutes");
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    Ok(())
}
