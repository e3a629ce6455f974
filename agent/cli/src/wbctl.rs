//! wbctl's command line.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub use crate::daemon::SOCKET;

#[derive(Parser, Debug)]
#[command(name = "wbctl", about = "Query and control the writebehindd daemon")]
pub struct Cli {
    /// The daemon's control socket.
    #[arg(long, global = true, default_value = SOCKET)]
    pub socket: PathBuf,
    /// Print the daemon's answer as JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Backend, kernel, policies, devices, streaming writers and counters.
    Status,
    /// Active streaming writers: pid, command, cgroup, files, bytes flushed, rate.
    Streams,
    /// Devices: bandwidth estimate, window, in flight, dirty, pacing.
    Devices,
    /// The effective policy of a process or a cgroup (default: the root's).
    Policy {
        #[arg(long, conflicts_with = "cgroup")]
        pid: Option<u32>,
        #[arg(long)]
        cgroup: Option<String>,
    },
    /// Refresh `status` every second until interrupted.
    Watch,
    /// Metrics in Prometheus's text format, for a textfile collector and promtool.
    Metrics {
        /// OpenMetrics 1.0 instead, as --metrics-listen serves it.
        #[arg(long)]
        openmetrics: bool,
    },
    /// Re-read the policy files (root only; like systemctl reload).
    Reload,
    /// Per systemd unit since the daemon started: streams, bytes written behind, files flushed, time paced.
    Units,
    /// Print a shell completion script.
    Completions {
        #[arg(value_parser = SHELLS)]
        shell: String,
    },
}

/// The shells wbctl writes completions for (clap_complete::Shell's values;
/// the daemon's library tests that each parses as one).
pub const SHELLS: [&str; 5] = ["bash", "elvish", "fish", "powershell", "zsh"];

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn policy_takes_a_pid_or_a_cgroup() {
        let cli = Cli::try_parse_from(["wbctl", "policy", "--pid", "1", "--json"]).unwrap();
        assert!(cli.json && matches!(cli.cmd, Cmd::Policy { pid: Some(1), cgroup: None }));
        assert!(Cli::try_parse_from(["wbctl", "policy", "--pid", "1", "--cgroup", "/"]).is_err());
        assert!(Cli::try_parse_from(["wbctl", "completions", "tcsh"]).is_err());
    }
}
