//! What the daemon reports about itself: one snapshot, refreshed by the
//! intake task every second and read by the control socket.  The same
//! types are what `wbctl` decodes, so the protocol is defined once.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The control protocol's version; a request names the one it speaks.
pub const PROTOCOL: u32 = 1;
pub const SOCKET: &str = "/run/writebehindd/control.sock";

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
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
    pub streams: Vec<StreamStatus>,
    pub counters: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DeviceStatus {
    pub bdi: String,
    /// Write bandwidth estimate, bytes per second.
    pub bandwidth: u64,
    /// The root policy's window on this device, bytes.
    pub window: u64,
    /// What the submitter keeps in flight, bytes.
    pub chunk: u64,
    /// Dirty + writeback bytes of the device at its last event.
    pub dirty: u64,
    /// The bdi dirty cap set for pacing, bytes; 0 when not pacing.
    pub paced_budget: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StreamStatus {
    pub pid: u32,
    pub comm: String,
    pub cgroup: String,
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

/// One request line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    pub v: u32,
    pub cmd: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
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

/// OpenMetrics text for a status snapshot.
pub fn metrics(s: &Status) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, f64)>| {
        out += &format!("# TYPE writebehindd_{name} {kind}\n# HELP writebehindd_{name} {help}\n");
        for (labels, v) in samples {
            let suffix = if kind == "counter" { "_total" } else { "" };
            out += &format!("writebehindd_{name}{suffix}{labels} {v}\n");
        }
    };
    let dev = |f: &dyn Fn(&DeviceStatus) -> u64| -> Vec<(String, f64)> {
        s.devices.iter().map(|d| (format!("{{bdi=\"{}\"}}", d.bdi), f(d) as f64)).collect()
    };
    family("uptime_seconds", "gauge", "Seconds since the daemon started.", vec![(String::new(), s.uptime_s)]);
    family(
        "on_battery",
        "gauge",
        "1 while the host runs on battery.",
        vec![(String::new(), s.on_battery as u8 as f64)],
    );
    family("device_bandwidth_bytes", "gauge", "Estimated write bandwidth, bytes per second.", dev(&|d| d.bandwidth));
    family("device_window_bytes", "gauge", "Window of the root policy on the device.", dev(&|d| d.window));
    family("device_dirty_bytes", "gauge", "Dirty and writeback bytes at the last event.", dev(&|d| d.dirty));
    family("device_paced_budget_bytes", "gauge", "bdi dirty cap while pacing, 0 otherwise.", dev(&|d| d.paced_budget));
    family("streams", "gauge", "Active streaming writers.", vec![(String::new(), s.streams.len() as f64)]);
    let counters = s.counters.iter().map(|(k, v)| (format!("{{what=\"{k}\"}}"), *v as f64)).collect();
    family("events", "counter", "Agent counters by kind.", counters);
    out += "# EOF\n";
    out
}
