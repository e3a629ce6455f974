//! writebehindd's options.  The defaults are the daemon's own constants,
//! written out here (this crate has no daemon code); the daemon's library
//! tests that they agree.

use std::{net::SocketAddr, path::PathBuf};

use clap::{Parser, ValueEnum};

pub const POLICY_DIR: &str = "/etc/writebehindd/policies.d";
pub const SOCKET: &str = "/run/writebehindd/control.sock";
pub const MAX_STREAMS: usize = 8192;

#[derive(Parser, Debug)]
#[command(
    name = "writebehindd",
    about = "write-behind for streaming writers",
    long_about = "Keeps the dirty page cache of streaming writers near a small window by starting writeback \
                  behind them. Runs in the foreground until SIGINT/SIGTERM; SIGHUP re-reads the policies (a broken \
                  file is rejected, the running policy stays).",
    override_usage = "writebehindd [--policy-dir DIR] [--policy FILE]... [--backend KIND] [--pacing-lever LEVER]\n       \
                      \x20            [--max-streams N] [--control PATH] [--control-group GRP] [--metrics-listen ADDR]\n       \
                      \x20            [--observe]\n       \
                      writebehindd --check-policy PATH...\n       \
                      writebehindd --restore",
    after_help = "Policies: policies/README.md and the embedded default, policies/default.toml.\n\
                  Log level: RUST_LOG (default info).",
    // As the hand-written parser did: an option given again replaces it.
    args_override_self = true
)]
pub struct Args {
    /// Policy drop-ins, *.toml in name order.
    #[arg(long, value_name = "DIR", default_value = POLICY_DIR)]
    pub policy_dir: PathBuf,
    /// One more policy file, applied after the directory; may be given more than once.
    #[arg(long = "policy", value_name = "FILE")]
    pub policies: Vec<PathBuf>,
    /// Validate policy files (or directories of them), print the effective policy per match, and exit.
    /// Takes every argument after it.
    #[arg(long, value_name = "PATH", num_args = 1.., allow_hyphen_values = true, trailing_var_arg = true)]
    pub check_policy: Option<Vec<PathBuf>>,
    /// Put back the bdi and global dirty limits a killed daemon was pacing with (journaled in
    /// /run/writebehindd/paced-bdis and dirty-limits), and exit; refused while a daemon runs (it
    /// restores them itself).
    #[arg(long)]
    pub restore: bool,
    /// Which hooks see the writers.
    #[arg(long, value_name = "KIND", value_enum, default_value_t = Backend::Auto)]
    pub backend: Backend,
    /// How a device's dirty pages are held down while it is paced.
    #[arg(long, value_name = "LEVER", value_enum, default_value_t = Lever::Auto)]
    pub pacing_lever: Lever,
    /// Streams at most, each holding its file and a pidfd; beyond it new streams are left to the kernel,
    /// counted as over_cap.
    #[arg(long, value_name = "N", default_value_t = MAX_STREAMS, value_parser = positive)]
    pub max_streams: usize,
    /// Control socket for wbctl.
    #[arg(long, value_name = "PATH", default_value = SOCKET)]
    pub control: PathBuf,
    /// Also let this group (a name or a gid) read the daemon's state (wbctl status).
    #[arg(long, value_name = "GRP")]
    pub control_group: Option<String>,
    /// Serve OpenMetrics at http://ADDR/metrics (off by default; a loopback address such as
    /// 127.0.0.1:9477 unless you mean it).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Observe only: detect streams and report what would be done (windows, closes, caps; `wbctl
    /// status` says "would"), without any writeback call or dirty-limit change. As a root policy's
    /// mode = "observe", for every cgroup whose policy acts.
    #[arg(long)]
    pub observe: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// fentry where the kernel allows it, else syscall tracepoints.
    Auto,
    /// fentry and fexit on the kernel's write and close functions.
    Fentry,
    /// Syscall tracepoints.
    Tracepoint,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lever {
    /// A device's own strict_limit and max_bytes where the kernel has them (6.2+), else the global
    /// vm.dirty_bytes while a device needs pacing.
    Auto,
    /// A device's own strict_limit and max_bytes only.
    Bdi,
    /// The global vm.dirty_bytes only.
    Global,
}

fn positive(v: &str) -> Result<usize, String> {
    v.parse().ok().filter(|&n| n > 0).ok_or_else(|| "not a positive number".into())
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser, error::ErrorKind};

    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("writebehindd").chain(args.iter().copied()))
    }

    #[test]
    fn the_definition_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn an_option_given_again_replaces_it_and_policies_add_up() {
        let a = parse(&["--backend", "fentry", "--backend", "tracepoint", "--restore", "--restore"]).unwrap();
        assert_eq!(a.backend, Backend::Tracepoint);
        assert!(a.restore);
        let a = parse(&["--policy", "a.toml", "--policy", "b.toml"]).unwrap();
        assert_eq!(a.policies, [PathBuf::from("a.toml"), PathBuf::from("b.toml")]);
    }

    #[test]
    fn defaults() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.policy_dir, PathBuf::from(POLICY_DIR));
        assert_eq!(a.control, PathBuf::from(SOCKET));
        assert_eq!(a.max_streams, MAX_STREAMS);
        assert_eq!((a.backend, a.pacing_lever), (Backend::Auto, Lever::Auto));
        assert!(a.policies.is_empty() && a.check_policy.is_none() && !a.restore);
        assert!(a.control_group.is_none() && a.metrics_listen.is_none() && !a.observe);
    }

    #[test]
    fn options_take_their_values() {
        let a = parse(&[
            "--policy-dir",
            "/d",
            "--policy",
            "a.toml",
            "--policy",
            "b.toml",
            "--backend",
            "tracepoint",
            "--pacing-lever",
            "global",
            "--max-streams",
            "8",
            "--control",
            "/s",
            "--control-group",
            "adm",
            "--metrics-listen",
            "127.0.0.1:9477",
            "--observe",
        ])
        .unwrap();
        assert!(a.observe);
        assert_eq!(a.policy_dir, PathBuf::from("/d"));
        assert_eq!(a.policies, [PathBuf::from("a.toml"), PathBuf::from("b.toml")]);
        assert_eq!((a.backend, a.pacing_lever, a.max_streams), (Backend::Tracepoint, Lever::Global, 8));
        assert_eq!(a.control, PathBuf::from("/s"));
        assert_eq!(a.control_group.as_deref(), Some("adm"));
        assert_eq!(a.metrics_listen, Some("127.0.0.1:9477".parse().unwrap()));
    }

    #[test]
    fn check_policy_takes_the_rest() {
        let a = parse(&["--policy-dir", "/d", "--check-policy", "a.toml", "--restore", "dir"]).unwrap();
        assert_eq!(a.check_policy.unwrap(), ["a.toml", "--restore", "dir"].map(PathBuf::from));
        assert!(!a.restore);
        assert_eq!(parse(&["--check-policy"]).unwrap_err().kind(), ErrorKind::InvalidValue);
    }

    #[test]
    fn bad_arguments_are_refused() {
        for bad in [
            &["--max-streams", "0"][..],
            &["--max-streams", "x"],
            &["--max-streams"],
            &["--backend", "kprobe"],
            &["--pacing-lever", "vm"],
            &["--metrics-listen", "localhost"],
            &["--bogus"],
            &["extra"],
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
        }
        let e = parse(&["--max-streams", "0"]).unwrap_err().to_string();
        assert!(e.contains("not a positive number"), "{e}");
    }
}
