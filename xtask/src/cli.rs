//! `cargo xtask`'s command line: its subcommands, their options and help.
//! Each subcommand's options are its module's `Args`; the internal ones
//! (run by xtask itself, hidden from the help) take their arguments as
//! they come.

use clap::{Parser, Subcommand};

use crate::{bench, deb, install, systest, vmtest};

/// The project's build, run, test and bench entry points.
#[derive(Parser, Debug, PartialEq)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", args_override_self = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Cmd>,
}

#[derive(Subcommand, Debug, PartialEq)]
pub enum Cmd {
    /// build the daemon (release) and run it in the foreground as root
    Run {
        /// the daemon's arguments (after `--`)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
        args: Vec<String>,
    },
    /// build, then run all tests (needs root: they load BPF and make loop devices)
    ///
    /// Builds, then runs all tests (needs root: they load BPF and make loop
    /// devices): the host tests, vmtest --quick beside them, deb --check,
    /// bench --smoke and systest --quick. With ARGS, only the host tests run.
    #[command(verbatim_doc_comment)]
    Test {
        /// arguments for cargo test (e.g. a test name filter)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
        args: Vec<String>,
    },
    Bench(bench::Args),
    Vmtest(vmtest::Args),
    Systest(systest::Args),
    /// build (release) and install the daemon, wbctl, the systemd unit, completions and docs under DIR
    ///
    /// Builds (release) and installs the daemon, wbctl, the systemd unit,
    /// completions and docs under DIR (default /); then
    /// systemctl enable --now writebehindd
    #[command(verbatim_doc_comment)]
    Install(install::Args),
    /// remove what install put there (policies in /etc are kept)
    Uninstall(install::Args),
    Deb(deb::Args),
    /// Run inside the vmtest guest: each backend's cost per write ([SECS]).
    #[command(hide = true)]
    Overhead {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run by `deb --check`, in a mount namespace of its own (DEB).
    #[command(hide = true)]
    DebTryout {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The bench's in-application writers (Linus's loop, RWF_DONTCACHE).
    #[command(hide = true)]
    Writer {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

