//! Fuzz targets for everything the daemon decodes from outside: policy files,
//! control-socket request lines, ring-buffer records.  Each must turn any
//! input into a value or a clear error, never a panic.  proptest, with a
//! fixed case count so CI spends a bounded time here (a few seconds);
//! PROPTEST_CASES raises it for a longer run.

use proptest::prelude::*;
use writebehindd::{
    abi::{EventKind, WB_NAME_LEN, WB_PATH_DEPTH, wb_event, wb_event_kind, wb_path_event},
    control::parse_request,
    policies::PolicySet,
    status::{Command, PROTOCOL, Request},
};

/// Any command, with any arguments.
fn command() -> impl Strategy<Value = Command> {
    let policy = (proptest::option::of(any::<u32>()), proptest::option::of("\\PC{0,30}"))
        .prop_map(|(pid, cgroup)| Command::Policy { pid, cgroup });
    prop_oneof![
        Just(Command::Status),
        Just(Command::Streams),
        Just(Command::Devices),
        any::<bool>().prop_map(|openmetrics| Command::Metrics { openmetrics }),
        Just(Command::Reload),
        policy,
    ]
}

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
        "leave_synced",
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

const EV: usize = std::mem::size_of::<wb_event>();
const PATH_EV: usize = std::mem::size_of::<wb_path_event>();
const CLOSE_PATH: u32 = wb_event_kind::WB_EV_CLOSE_PATH as u32;

/// One slot of a wb_path_event's names: mostly plain, else empty, ".",
/// "..", with a '/', random bytes, or filling the slot without its NUL;
/// garbage after the NUL, as a reused ring slot holds.
fn name_slot() -> impl Strategy<Value = Vec<u8>> {
    let len = WB_NAME_LEN as usize;
    let name = prop_oneof![
        24 => prop::sample::select(vec!["f.txt", "sub", ".x", "..y", "...", "a..b", "-"]).prop_map(|n| n.as_bytes().to_vec()),
        1 => prop::sample::select(vec!["", ".", "..", "/", "a/b", "/x", "x/"]).prop_map(|n| n.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..24),
        1 => (1u8..).prop_map(move |b| vec![b; len]),
    ];
    (name, any::<u8>()).prop_map(move |(mut n, garbage)| {
        n.push(0);
        n.resize(len.max(n.len()), garbage);
        n.truncate(len);
        n
    })
}

/// A path that can only lead down: relative, no empty, "." or ".." names.
fn plain_path(path: &std::ffi::CStr) -> bool {
    let b = path.to_bytes();
    !b.starts_with(b"/") && !b.contains(&0) && b.split(|&c| c == b'/').all(|n| !n.is_empty() && n != b"." && n != b"..")
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
    fn requests_round_trip(v in 0u32..4, cmd in command()) {
        let r = Request { v, cmd };
        let line = serde_json::to_string(&r).unwrap();
        match parse_request(&line) {
            Ok(got) => prop_assert!(v == PROTOCOL && got == r),
            Err(refusal) => prop_assert!(v != PROTOCOL && refusal.error.unwrap().contains("version")),
        }
    }

    /// A command this daemon lacks is refused by its name.
    #[test]
    fn unknown_commands_are_refused(cmd in "[a-z]{0,10}") {
        let line = serde_json::json!({ "v": PROTOCOL, "cmd": cmd }).to_string();
        match parse_request(&line) {
            Ok(got) => prop_assert!(Command::NAMES.contains(&cmd.as_str()) && serde_json::to_string(&got).unwrap() == line),
            Err(refusal) => prop_assert!(!Command::NAMES.contains(&cmd.as_str())
                && refusal.error.unwrap().starts_with("unknown command")),
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

    /// Records of either size: only the two exact sizes decode, a plain one
    /// as `decode` has it, a path-sized one only as a WB_EV_CLOSE_PATH.
    #[test]
    fn any_records_never_panic(bytes in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..400),
        prop::collection::vec(any::<u8>(), EV),
        (prop::collection::vec(any::<u8>(), EV), any::<u8>()).prop_map(|(mut b, fill)| {
            b.resize(PATH_EV, fill);
            b
        }),
    ]) {
        match wb_event::decode_any(&bytes) {
            None => {}
            Some((kind, _, None)) if bytes.len() == EV => prop_assert_eq!(wb_event::decode(&bytes).map(|d| d.0), Some(kind)),
            Some((kind, ev, path)) => {
                prop_assert!(bytes.len() == PATH_EV && kind == EventKind::Close);
                prop_assert!(ev.kind == CLOSE_PATH && ev.start <= ev.end);
                prop_assert!(path.as_deref().is_none_or(plain_path));
            }
        }
    }

    /// Path records with all 16 slots in play: the close is kept whenever its
    /// kind and range are right, its path only if it leads down; any other
    /// kind, or one byte more or less, is rejected.
    #[test]
    fn path_records_never_escape(kind in prop_oneof![3 => Just(CLOSE_PATH), 1 => 0u32..8, 1 => any::<u32>()],
                                 start in 0u64..64, end in 0u64..64,
                                 mut bytes in prop::collection::vec(any::<u8>(), EV),
                                 mut names in prop::collection::vec(name_slot(), WB_PATH_DEPTH as usize),
                                 used in 0..=WB_PATH_DEPTH as usize) {
        if let Some(slot) = names.get_mut(used) {
            slot[0] = 0; // the list's end, unless all 16 are used
        }
        bytes[std::mem::offset_of!(wb_event, kind)..][..4].copy_from_slice(&kind.to_ne_bytes());
        bytes[std::mem::offset_of!(wb_event, start)..][..8].copy_from_slice(&start.to_ne_bytes());
        bytes[std::mem::offset_of!(wb_event, end)..][..8].copy_from_slice(&end.to_ne_bytes());
        bytes.extend(names.concat());
        prop_assert_eq!(bytes.len(), PATH_EV);
        match wb_event::decode_any(&bytes) {
            Some((EventKind::Close, _, path)) => {
                prop_assert!(kind == CLOSE_PATH && start <= end);
                prop_assert!(path.as_deref().is_none_or(plain_path), "{:?}", path);
            }
            other => prop_assert!(other.is_none() && (kind != CLOSE_PATH || start > end)),
        }
        prop_assert!(wb_event::decode_any(&bytes[..PATH_EV - 1]).is_none());
        bytes.push(0);
        prop_assert!(wb_event::decode_any(&bytes).is_none());
    }
}
