//! The command lines of writebehindd and wbctl, as clap definitions: parsed
//! by the programs and rendered into their man pages by `cargo xtask deb`,
//! so that --help and the pages say the same.  clap only: no daemon code.
//!
//! Neither definition names a version: each program sets its own package's
//! ([`parse`]), and the man pages the package's.

pub mod daemon;
pub mod wbctl;

pub use clap;
use clap::Parser;

/// The command line of this process, for a program of `version`: on a bad
/// argument clap prints the error and the usage and exits with 2; --help
/// and --version print and exit with 0.
pub fn parse<T: Parser>(version: &'static str) -> T {
    let mut cmd = T::command().version(version);
    let matches = cmd.get_matches_mut();
    T::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut cmd).exit())
}
