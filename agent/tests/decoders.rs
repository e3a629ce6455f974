//! Fuzz targets for everything the daemon decodes from outside (issue 9):
//! policy files, control-socket request lines, ring-buffer records.  Each
//! must turn any input into a value or a clear error, never a panic.
//! proptest, with a fixed case count so CI spends a bounded time here (a few
//! seconds); PROPTEST_CASES raises it for a longer run.

use proptest::prelude::*;
use writebehindd::{
    abi::wb_event,
    control::parse_request,
    policies::PolicySet,
    status::{PROTOCOL, Request},
};

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(4096);
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

/// Text shaped like a policy file: real keys and values in random order,
/// with random damage, so the parser's deeper checks are reached too.
fn policy_text() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec![
        "mode",
        "window",
        "window_seconds",
        "min_window",
        "max_window",
        "multi_file",
        "burst",
        "quiet",
        "dirty_seconds",
        "pacing",
        "in_flight_seconds",
        "on_battery",
        "cgroup",
        "bogus",
    ]);
    let value = prop::sample::select(vec![
        "\"off\"",
        "\"append\"",
        "\"sequential\"",
        "\"auto\"",
        "\"16MiB\"",
        "\"0\"",
        "\"-1MiB\"",
        "\"1e99GiB\"",
        "\"5s\"",
        "\"lazy\"",
        "0.5",
        "-3",
        "1e308",
        "true",
        "false",
        "\"/system.slice/*\"",
        "\"**\"",
        "\"\"",
        "[1, 2]",
        "{ a = 1 }",
    ]);
    let line = prop_oneof![
        (key, value).prop_map(|(k, v)| format!("{k} = {v}")),
        Just("[[policy]]".to_owned()),
        Just("cgroup = \"/a/**/b\"".to_owned()),
        "[ -~]{0,40}",
    ];
    prop::collection::vec(line, 0..12).prop_map(|l| l.join("\n"))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn policy_files_never_panic(text in policy_text()) {
        let _ = PolicySet::from_texts(&[("fuzz.toml".to_owned(), text)]);
    }

    #[test]
    fn policy_bytes_never_panic(text in "\\PC{0,200}") {
        let _ = PolicySet::from_texts(&[("fuzz.toml".to_owned(), text)]);
    }

    #[test]
    fn request_lines_never_panic(line in "\\PC{0,200}") {
        let _ = parse_request(&line);
    }

    /// Any well-formed request decodes to itself; other versions are refused.
    #[test]
    fn requests_round_trip(v in 0u32..4, cmd in "[a-z]{0,10}", pid in proptest::option::of(any::<u32>()),
                           cgroup in proptest::option::of("\\PC{0,30}")) {
        let r = Request { v, cmd, pid, cgroup };
        let line = serde_json::to_string(&r).unwrap();
        match parse_request(&line) {
            Ok(got) => prop_assert!(v == PROTOCOL && got.cmd == r.cmd && got.pid == r.pid && got.cgroup == r.cgroup),
            Err(refusal) => prop_assert!(v != PROTOCOL && refusal.error.unwrap().contains("version")),
        }
    }

    /// Ring-buffer records: any bytes decode or are rejected, never guessed.
    #[test]
    fn event_records_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        if let Some((_, ev)) = wb_event::decode(&bytes) {
            prop_assert_eq!(bytes.len(), std::mem::size_of::<wb_event>());
            prop_assert!(ev.start <= ev.end);
            let _ = (ev.comm(), ev.bdi());
        }
    }

    #[test]
    fn event_records_of_the_right_size(bytes in prop::collection::vec(any::<u8>(), std::mem::size_of::<wb_event>())) {
        let _ = wb_event::decode(&bytes).map(|(_, ev)| (ev.comm(), ev.bdi(), ev.st_dev()));
    }
}
