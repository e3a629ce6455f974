//! wbctl: ask the running writebehindd what it is doing.  A thin client of
//! the control socket: every answer comes from the daemon.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    process::ExitCode,
    time::Duration,
};

use clap::{CommandFactory, ValueEnum};
use writebehindd::status::{
    Command, DeviceStatus, PROTOCOL, Request, Response, Status, StreamStatus, UnitStatus, acts_on_terminal, printable,
    printable_json,
};
use writebehindd_cli::wbctl::{Cli, Cmd};

fn main() -> ExitCode {
    let cli: Cli = writebehindd_cli::parse(env!("CARGO_PKG_VERSION"));
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The daemon's refusals may quote what a user sent it.
            eprintln!("wbctl: {}", printable(&e));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<(), String> {
    let cmd = match &cli.cmd {
        Cmd::Completions { shell } => {
            let shell = clap_complete::Shell::from_str(shell, false)?;
            let mut cmd = Cli::command().version(env!("CARGO_PKG_VERSION"));
            clap_complete::generate(shell, &mut cmd, "wbctl", &mut std::io::stdout());
            return Ok(());
        }
        Cmd::Watch => return watch(cli),
        Cmd::Status => Command::Status,
        Cmd::Streams => Command::Streams,
        Cmd::Devices => Command::Devices,
        Cmd::Policy { pid, cgroup } => Command::Policy { pid: *pid, cgroup: cgroup.clone() },
        Cmd::Metrics { openmetrics } => Command::Metrics { openmetrics: *openmetrics },
        Cmd::Reload => Command::Reload,
        Cmd::Units => Command::Units,
    };
    let data = ask(cli, &Request { v: PROTOCOL, cmd })?;
    if cli.json {
        println!("{}", printable_json(&serde_json::to_string_pretty(&data).unwrap_or_default()));
        return Ok(());
    }
    let decode = |e: serde_json::Error| format!("unexpected answer from the daemon: {e}");
    match &cli.cmd {
        Cmd::Status => print!("{}", status_text(&serde_json::from_value(data).map_err(decode)?)),
        Cmd::Streams => {
            print!("{}", streams_text(&serde_json::from_value::<Vec<StreamStatus>>(data).map_err(decode)?, false))
        }
        Cmd::Devices => print!("{}", devices_text(&serde_json::from_value::<Vec<DeviceStatus>>(data).map_err(decode)?)),
        Cmd::Units => print!("{}", units_text(&serde_json::from_value::<Vec<UnitStatus>>(data).map_err(decode)?)),
        Cmd::Policy { .. } => {
            println!("cgroup {}", printable(data["cgroup"].as_str().unwrap_or("?")));
            if let Some(p) = data["policy"].as_object() {
                for (k, v) in p {
                    println!("  {} = {}", printable(k), printable(v.as_str().unwrap_or("?")));
                }
            }
        }
        // Metrics and messages, read by machines too: byte for byte, but for
        // a line holding a control character (which OpenMetrics forbids anyway).
        _ => {
            let text = data.as_str().map(str::to_owned).unwrap_or_else(|| data.to_string());
            for line in text.trim_end().lines() {
                if line.chars().any(acts_on_terminal) {
                    println!("{}", printable(line));
                } else {
                    println!("{line}");
                }
            }
        }
    }
    Ok(())
}

/// One request, one answer; the daemon's error becomes ours.
fn ask(cli: &Cli, req: &Request) -> Result<serde_json::Value, String> {
    let mut s = UnixStream::connect(&cli.socket).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            format!("writebehindd is not running (no daemon at {})", cli.socket.display())
        }
        std::io::ErrorKind::PermissionDenied => format!("permission denied on {}", cli.socket.display()),
        _ => format!("cannot reach writebehindd at {}: {e}", cli.socket.display()),
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let line = serde_json::to_string(req).map_err(|e| e.to_string())? + "\n";
    // A peer the daemon turns away is answered and hung up on before it
    // may have written: its refusal is still there to read.
    let written = s.write_all(line.as_bytes());
    let mut answer = String::new();
    BufReader::new(&s).read_line(&mut answer).map_err(|e| format!("reading the daemon's answer: {e}"))?;
    if answer.is_empty() {
        written.map_err(|e| format!("writing to the daemon: {e}"))?;
    }
    let r: Response = serde_json::from_str(&answer).map_err(|e| format!("unexpected answer from the daemon: {e}"))?;
    match r {
        Response { ok: true, data: Some(d), .. } => Ok(d),
        Response { error, .. } => Err(error.unwrap_or_else(|| "the daemon refused without a reason".into())),
    }
}

fn watch(cli: &Cli) -> Result<(), String> {
    let mut history: std::collections::HashMap<String, Vec<u64>> = Default::default();
    loop {
        let data = ask(cli, &Request { v: PROTOCOL, cmd: Command::Status })?;
        let s: Status = serde_json::from_value(data).map_err(|e| e.to_string())?;
        print!("\x1b[H\x1b[2J{}", status_text(&s));
        println!("\ndirty per device, last 60 s:");
        for d in &s.devices {
            let h = history.entry(d.bdi.clone()).or_default();
            h.push(d.dirty);
            if h.len() > 60 {
                h.remove(0);
            }
            println!("  {:<10} {} {:>10}  {}", printable(&d.bdi), sparkline(h), mib(d.dirty), printable(&d.name));
        }
        std::io::stdout().flush().ok();
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn sparkline(v: &[u64]) -> String {
    let bars = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = v.iter().copied().max().unwrap_or(0).max(1);
    v.iter().map(|&x| bars[(x * 7 / max) as usize]).collect()
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

fn status_text(s: &Status) -> String {
    // Said first: an observing daemon's figures are what it would do.
    let mut out = match s.mode.as_str() {
        "observe" => {
            "mode: observe (nothing is written back or capped; would_ counters and \"would\" caps say what would be)\n"
                .to_owned()
        }
        _ => String::new(),
    };
    out += &format!(
        "writebehindd {} — backend {}, kernel {}, up {:.0} s{}\npolicies: {}\ncgroups: {}\n\n",
        printable(&s.version),
        printable(&s.backend),
        printable(&s.kernel),
        s.uptime_s,
        if s.on_battery { ", on battery" } else { "" },
        printable(&s.policy_sources.join(", ")),
        printable(&s.cgroups)
    );
    out += &devices_text(&s.devices);
    if let Some(g) = &s.global_limits {
        out += &format!(
            "global dirty limits while pacing: dirty_bytes {}, dirty_background_bytes {} (then back to {})\n",
            mib(g.dirty_bytes),
            mib(g.background_bytes),
            printable(&g.original)
        );
    }
    out += "\n";
    out += &streams_text(&s.streams, s.mode == "observe");
    out += "\ncounters:";
    for (k, v) in s.counters.iter().filter(|(k, v)| **v > 0 || !k.starts_with("error_")) {
        out += &format!(" {}={v}", printable(k));
    }
    out + "\n"
}

fn devices_text(d: &[DeviceStatus]) -> String {
    let mut out = format!(
        "{:<10} {:>12} {:>10} {:>10} {:>10} {:>19}  {:<10}  {}\n",
        "DEVICE", "BANDWIDTH", "WINDOW", "IN FLIGHT", "DIRTY", "PACING", "BACKING", "NAME"
    );
    for d in d {
        let pacing = match (d.paced_budget, d.lever.as_str()) {
            (0, _) if d.would_budget != 0 => format!("would {} {}", mib(d.would_budget), printable(&d.would_lever)),
            (0, _) => "off".into(),
            (b, "global") => format!("cap {} global", mib(b)),
            (b, _) => format!("cap {}", mib(b)),
        };
        out += &format!(
            "{:<10} {:>10}/s {:>10} {:>10} {:>10} {:>19}  {:<10}  {}\n",
            printable(&d.bdi),
            mib(d.bandwidth),
            mib(d.window),
            mib(d.chunk),
            mib(d.dirty),
            pacing,
            printable(&d.backing),
            printable(&d.name)
        );
        if d.would_budget != 0 {
            out += &format!(
                "{:<10} would pace: budget {} via {} (observing writers; not set)\n",
                "",
                mib(d.would_budget),
                printable(&d.would_lever)
            );
        }
        if d.stalled_secs > 0.0 {
            out += &format!(
                "{:<10} stalled: writeback has waited {:.0} s in one call (the server or the disk does not answer)\n",
                "", d.stalled_secs
            );
        }
    }
    if d.is_empty() {
        out += "(no device seen yet)\n";
    }
    out
}

/// `observing`: the whole daemon observes, and what its writers wrote is
/// what it would have flushed.
fn streams_text(v: &[StreamStatus], observing: bool) -> String {
    let mut out = format!(
        "{:>7} {:<16} {:<10} {:<8} {:>6} {:>12} {:>10}  {}\n",
        "PID",
        "COMMAND",
        "KIND",
        "DEVICE",
        "FILES",
        if observing { "WOULD FLUSH" } else { "FLUSHED" },
        "RATE",
        "CGROUP"
    );
    for s in v {
        out += &format!(
            "{:>7} {:<16} {:<10} {:<8} {:>6} {:>12} {:>8}/s  {}\n",
            s.pid,
            printable(&s.comm),
            printable(&s.kind),
            printable(&s.bdi),
            s.files,
            mib(s.bytes_flushed),
            mib(s.rate() as u64),
            printable(&s.cgroup)
        );
    }
    if v.is_empty() {
        out += "(no streaming writer)\n";
    }
    out
}

/// `wbctl units`: each systemd unit's writers since the daemon started.
fn units_text(v: &[UnitStatus]) -> String {
    let mut out = format!(
        "{:<32} {:>7} {:>14} {:>7} {:>9} {:>10}  {}\n",
        "UNIT", "STREAMS", "WRITTEN BEHIND", "FILES", "PACED", "PEAK DIRTY", "CGROUP"
    );
    for u in v {
        let streams = if u.streams_observed > 0 {
            format!("{}+{}o", u.streams, u.streams_observed)
        } else {
            u.streams.to_string()
        };
        out += &format!(
            "{:<32} {:>7} {:>14} {:>7} {:>8.1}s {:>10}  {}\n",
            printable(&u.unit),
            streams,
            mib(u.written_behind_bytes),
            u.files_flushed,
            u.paced_secs,
            mib(u.peak_dirty_bytes),
            printable(&u.cgroup)
        );
    }
    if v.is_empty() {
        out += "(no writer seen yet)\n";
    }
    out
}
