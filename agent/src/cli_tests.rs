//! The command lines (writebehindd-cli, which holds no daemon code) spell
//! out the daemon's defaults and wbctl's shells: here they are checked
//! against the constants and the crate they copy.

use clap::ValueEnum;
use writebehindd_cli::{daemon, wbctl};

#[test]
fn the_daemons_defaults_are_its_constants() {
    assert_eq!(daemon::POLICY_DIR, crate::policies::POLICY_DIR);
    assert_eq!(daemon::SOCKET, crate::status::SOCKET);
    assert_eq!(daemon::MAX_STREAMS, crate::streams::MAX_HELD);
}

#[test]
fn wbctl_offers_clap_completes_shells() {
    let theirs: Vec<String> = clap_complete::Shell::value_variants()
        .iter()
        .map(|s| s.to_possible_value().unwrap().get_name().into())
        .collect();
    assert_eq!(theirs, wbctl::SHELLS);
}
