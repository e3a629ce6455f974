//! What the daemon reports about itself: one snapshot, built by the intake
//! loop when the control socket asks for it.  The same
//! types are what `wbctl` decodes, so the protocol is defined once.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The control protocol's version; a request names the one it speaks.
pub const PROTOCOL: u32 = 1;
pub const SOCKET: &str = "/run/writebehindd/control.sock";

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    /// "act", or "observe" while the whole daemon observes (its root
    /// policy's mode, or --observe): what it would do is in the would_
    /// counters and each device's would_budget, and nothing is done.
    #[serde(default)]
    pub mode: String,
    /// Which hook layer is attached: "fentry", "tracepoint", or
    /// "fentry+sys_exit(...)" (loader.rs).
    pub backend: String,
    pub kernel: String,
    pub uptime_s: f64,
    /// Policy files in force, in the order applied.
    pub policy_sources: Vec<String>,
    /// The cgroup v2 hierarchy policies are matched in, and what that means here.
    pub cgroups: String,
    pub on_battery: bool,
    pub devices: Vec<DeviceStatus>,
    /// The global vm.dirty_bytes pacing sets where a device has no
    /// strict_limit of its own (kernels before 6.2); None while the
    /// administrator's limits are in force.
    #[serde(default)]
    pub global_limits: Option<crate::pacing::GlobalLimits>,
    pub streams: Vec<StreamStatus>,
    pub counters: BTreeMap<String, u64>,
    /// What each systemd unit's writers had done since the daemon started,
    /// most bytes written behind first (also `wbctl units`).
    #[serde(default)]
    pub units: Vec<UnitStatus>,
}

/// One systemd unit's writers since the daemon started (units.rs).  Units
/// beyond the table's cap are summed in unit "other"; writers in no unit
/// in "-".
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UnitStatus {
    /// "backup.service", "app-gnome-foo-1234.scope", "-", "other".  Its
    /// cgroup chosen by users below a delegated subtree: printable.
    pub unit: String,
    /// The cgroup of its latest stream; empty for "other".
    #[serde(default)]
    pub cgroup: String,
    /// Streams started (observing ones in streams_observed).
    pub streams: u64,
    #[serde(default)]
    pub streams_observed: u64,
    /// Bytes handed to writeback (windows of its streams, its closed files).
    pub written_behind_bytes: u64,
    /// Closed files flushed (or left to the kernel on a paced device).
    pub files_flushed: u64,
    /// Seconds a device was paced while the unit had a stream on it.
    pub paced_secs: f64,
    /// The peak dirty + writeback bytes of the devices its streams were on,
    /// while they were (a device's, not the unit's own share).
    pub peak_dirty_bytes: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DeviceStatus {
    /// The bdi's name in /sys/class/bdi: "major:minor" ("8:16"), or
    /// "btrfs-1"; for scripts.
    pub bdi: String,
    /// What people know it by: its kernel name and mount points ("sdb1
    /// /media/alice/STICK"), a network or FUSE mount's source and mount
    /// point ("127.0.0.1:/srv/nfs /mnt/nfs"); the bdi when nothing else is
    /// known.  Partly chosen by users (mount points, FUSE sources): escape
    /// it where printed (printable).
    #[serde(default)]
    pub name: String,
    /// Write bandwidth estimate, bytes per second.
    pub bandwidth: u64,
    /// The root policy's window on this device, bytes.
    pub window: u64,
    /// What the submitter keeps in flight, bytes.
    pub chunk: u64,
    /// Dirty + writeback bytes of the device at its last event.
    pub dirty: u64,
    /// The dirty cap set for pacing, bytes; 0 when not pacing.
    pub paced_budget: u64,
    /// How it is paced: "bdi" (its own strict_limit and max_bytes) or
    /// "global" (vm.dirty_bytes); empty when not paced.
    #[serde(default)]
    pub lever: String,
    /// The cap it would set for observing writers (a policy's mode
    /// "observe"), bytes, and through which lever ("bdi" or "global"); 0
    /// and empty when it would not pace.  Never written to the device.
    #[serde(default)]
    pub would_budget: u64,
    #[serde(default)]
    pub would_lever: String,
    /// What backs it ("disk", "network", "network (smb)", "fuse (uid 1000's)", ...): a
    /// device a user made drives no lever unless the policy says so.
    #[serde(default)]
    pub backing: String,
    /// How long its flusher thread has been in one call (an open, starting
    /// writeback, waiting for it), once 5 s or longer: its server or disk
    /// does not answer; 0 otherwise.
    #[serde(default)]
    pub stalled_secs: f64,
    /// Seconds the device was paced, in all, since the daemon started.
    #[serde(default)]
    pub paced_secs: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StreamStatus {
    pub pid: u32,
    pub comm: String,
    pub cgroup: String,
    /// The systemd unit its cgroup names ("backup.service"; "-" for none).
    #[serde(default)]
    pub unit: String,
    /// "file" (one file, held) or "multi-file" (a writer's closed files).
    pub kind: String,
    pub bdi: String,
    pub files: u64,
    pub bytes_flushed: u64,
    pub secs: f64,
}

impl StreamStatus {
    /// Bytes per second over the stream's life.
    pub fn rate(&self) -> f64 {
        if self.secs > 0.0 { self.bytes_flushed as f64 / self.secs } else { 0.0 }
    }
}

/// One request line: the protocol version it speaks and its command, as
/// `{"v":1,"cmd":"policy","pid":42}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub v: u32,
    #[serde(flatten)]
    pub cmd: Command,
}

/// What a request asks, named by its `cmd` field; a command's arguments
/// are fields beside it.  Fields a command does not take are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "lowercase")]
pub enum Command {
    Status,
    Streams,
    Devices,
    /// The effective policy of a cgroup (by its path), else of a process's
    /// cgroup, else of the root.
    Policy {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cgroup: Option<String>,
    },
    /// The metrics text: Prometheus's text format, or OpenMetrics 1.0
    /// (what the HTTP endpoint serves).
    Metrics {
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        openmetrics: bool,
    },
    /// Re-read the policy files (root only).
    Reload,
    /// What each systemd unit's writers had done since the daemon started.
    Units,
}

impl Command {
    /// Every command's name on the wire, in the order refusals list them.
    pub const NAMES: [&str; 7] = ["status", "streams", "devices", "policy", "metrics", "reload", "units"];
}

/// One response line: `ok` with `data`, or not with `error`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    pub v: u32,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Response {
    pub fn ok(data: serde_json::Value) -> Self {
        Self { v: PROTOCOL, ok: true, data: Some(data), error: None }
    }

    pub fn err(msg: impl Into<String>) -> Self {
        Self { v: PROTOCOL, ok: false, data: None, error: Some(msg.into()) }
    }
}

/// `s` made safe to print on a terminal: process names and cgroup paths
/// are chosen by unprivileged users, and a raw ESC, newline or C1 control
/// in them would let a user repaint root's terminal or forge table rows.
/// Control characters (C0, DEL, C1), bidi overrides and backslash are
/// escaped (`\x1b`, `\n`, `\u{9b}`, `\\`); everything else is kept.
pub fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_ascii_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if unsafe_to_show(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// JSON text with the characters serde_json leaves raw but a terminal may
/// act on (DEL, C1 controls, bidi overrides) written as `\uXXXX` escapes:
/// they only occur inside strings, so the JSON means the same.
pub fn printable_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c == '\x7f' || unsafe_to_show(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether `c` is one `printable` escapes for a terminal's sake (control
/// characters, C1, bidi overrides; not the backslash).
pub fn acts_on_terminal(c: char) -> bool {
    c.is_control() || unsafe_to_show(c)
}

/// Non-ASCII characters a terminal acts on instead of showing: C1 controls
/// (U+0080..U+009F, e.g. CSI), line/paragraph separators and the bidi
/// embeddings, overrides and isolates that reorder what follows them.
fn unsafe_to_show(c: char) -> bool {
    matches!(c, '\u{80}'..='\u{9f}' | '\u{200e}' | '\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_keep_their_wire_form() {
        let line = |cmd| serde_json::to_string(&Request { v: PROTOCOL, cmd }).unwrap();
        assert_eq!(line(Command::Status), r#"{"v":1,"cmd":"status"}"#);
        assert_eq!(line(Command::Policy { pid: None, cgroup: None }), r#"{"v":1,"cmd":"policy"}"#);
        assert_eq!(line(Command::Policy { pid: Some(42), cgroup: None }), r#"{"v":1,"cmd":"policy","pid":42}"#);
        assert_eq!(
            line(Command::Policy { pid: None, cgroup: Some("/a".into()) }),
            r#"{"v":1,"cmd":"policy","cgroup":"/a"}"#
        );
        for name in Command::NAMES {
            let r: Request = serde_json::from_str(&format!(r#"{{"v":1,"cmd":"{name}"}}"#)).unwrap();
            assert_eq!(line(r.cmd), format!(r#"{{"v":1,"cmd":"{name}"}}"#));
        }
        // As before: a field a command does not take is ignored.
        let r: Request = serde_json::from_str(r#"{"v":1,"cmd":"status","pid":3,"x":[]}"#).unwrap();
        assert_eq!(r.cmd, Command::Status);
    }

    #[test]
    fn printable_escapes_what_a_terminal_would_act_on() {
        assert_eq!(printable("dd"), "dd");
        assert_eq!(printable("\x1b]0;pwn\x07"), "\\x1b]0;pwn\\x07");
        assert_eq!(printable("\x1b[2J"), "\\x1b[2J");
        assert_eq!(printable("a\nb\tc\rd"), "a\\nb\\tc\\rd");
        assert_eq!(printable("\0\x7f"), "\\x00\\x7f");
        assert_eq!(printable("\u{9b}31m"), "\\u{9b}31m");
        assert_eq!(printable("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
        // Backslash is escaped too, so "\x1b" typed literally cannot pass for an escape.
        assert_eq!(printable("\\x1b"), "\\\\x1b");
        // What wbctl leaves byte-exact in machine-read text: a backslash is not a control.
        assert!(acts_on_terminal('\x1b') && acts_on_terminal('\u{9b}') && !acts_on_terminal('\\'));
        // Printable non-ASCII stays readable (the daemon decodes invalid UTF-8 as U+FFFD).
        assert_eq!(printable("kopie-ü-日本 \u{fffd}"), "kopie-ü-日本 \u{fffd}");
    }

    #[test]
    fn printable_json_keeps_the_meaning() {
        let raw = "\x1b[2J\x7f\u{9b}\u{202e}ü\n";
        let json = printable_json(&serde_json::to_string(raw).unwrap());
        assert!(json.chars().all(|c| !c.is_control() && !unsafe_to_show(c)), "{json}");
        assert_eq!(serde_json::from_str::<String>(&json).unwrap(), raw);
    }
}
