//! The operator's surface: wbctl against the real daemon over its control
//! socket, privileges, malformed requests, metrics, the unit file.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::{net::UnixStream, process::CommandExt},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Result, bail};
use wb_tests::*;

fn wbctl(d: &Daemon, args: &[&str]) -> Result<(bool, String)> {
    let out = d.wbctl().args(args).output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Ok((out.status.success(), text))
}

fn wbctl_as_nobody(d: &Daemon, args: &[&str]) -> Result<(bool, String)> {
    let out = as_nobody(bin_dir().join("wbctl")).arg("--socket").arg(d.socket()).args(args).output()?;
    Ok((out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned()))
}

/// A directory on `fs` that nobody may write to.
fn nobodys_dir(fs: &Mounted) -> Result<std::path::PathBuf> {
    let dir = fs.path("nobody");
    std::fs::create_dir(&dir)?;
    run(Command::new("chown").arg("65534:65534").arg(&dir))?;
    Ok(dir)
}

fn raw(d: &Daemon, line: &str) -> Result<serde_json::Value> {
    let mut s = UnixStream::connect(d.socket())?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(line.as_bytes())?;
    let mut answer = String::new();
    BufReader::new(&s).read_line(&mut answer)?;
    Ok(serde_json::from_str(&answer)?)
}

#[test]
fn wbctl_shows_a_live_stream_and_guards_state_changes() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::new(2048)?, "ext4")?;
    let d = Daemon::start_with_policy("burst = \"4MiB\"\n")?;
    // A dd paced by pv, alive long enough to be seen.
    let mut writer = Command::new("sh")
        .arg("-c")
        .arg(format!("head -c 1200M /dev/zero | pv -qL 100m | dd of={} bs=1M status=none", fs.path("live").display()))
        .stdin(Stdio::null())
        .process_group(0)
        .spawn()?;
    std::thread::sleep(Duration::from_secs(3));

    let (ok, status) = wbctl(&d, &["status"])?;
    println!("{status}");
    assert!(ok && status.contains("backend tracepoint") && status.contains(" dd "), "{status}");
    assert!(status.contains(&fs.bdi()?), "the device table lacks the device:\n{status}");

    for cmd in ["status", "streams", "devices", "policy"] {
        let (ok, json) = wbctl(&d, &["--json", cmd])?;
        assert!(ok, "{cmd}: {json}");
        let v: serde_json::Value =
            serde_json::from_str(&json).map_err(|e| anyhow::anyhow!("{cmd} --json: {e}: {json}"))?;
        if cmd == "streams" {
            let dd = v.as_array().and_then(|a| a.iter().find(|s| s["comm"] == "dd"));
            let Some(dd) = dd else { bail!("no dd in streams: {v}") };
            assert!(dd["bytes_flushed"].as_u64().unwrap_or(0) > 0, "{dd}");
            let pid = dd["pid"].as_u64().unwrap().to_string();
            let (ok, p) = wbctl(&d, &["policy", "--pid", &pid])?;
            assert!(ok && p.contains("mode = \"sequential\"") && p.contains("burst = \"4MiB\""), "{p}");
        }
    }

    // The device is named by its kernel name and mount point.
    let name = format!("{} {}", fs.device.name(), fs.dir.display());
    assert!(status.contains(&name), "the device table lacks the device's name {name}:\n{status}");

    // Metrics parse as OpenMetrics with a real parser.
    let (ok, metrics) = wbctl(&d, &["metrics", "--openmetrics"])?;
    assert!(ok, "{metrics}");
    let mut py = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import sys\nfrom prometheus_client.openmetrics.parser import text_string_to_metric_families as p\n\
             print(len(list(p(sys.stdin.read()))))",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    py.stdin.take().unwrap().write_all(metrics.as_bytes())?;
    let out = py.wait_with_output()?;
    assert!(out.status.success(), "not OpenMetrics:\n{metrics}\n{}", String::from_utf8_lossy(&out.stderr));

    // Nobody may not change state, nor read it (no control group set), and
    // is told how to get access.
    for cmd in ["reload", "status"] {
        let (ok, e) = wbctl_as_nobody(&d, &[cmd])?;
        assert!(!ok && e.contains("permission denied") && e.contains("--control-group"), "{e}");
    }
    let (ok, _) = wbctl(&d, &["reload"])?;
    assert!(ok, "root may reload");

    // Malformed requests get errors; the daemon keeps serving.
    for bad in ["garbage\n", "{\"v\":99,\"cmd\":\"status\"}\n", "{\"v\":1,\"cmd\":\"format-disk\"}\n", "{}\n"] {
        let r = raw(&d, bad)?;
        assert_eq!(r["ok"], false, "{bad:?} -> {r}");
        assert!(r["error"].as_str().is_some_and(|e| !e.is_empty()), "{r}");
    }
    let huge = "x".repeat(100_000) + "\n";
    assert_eq!(raw(&d, &huge)?["ok"], false);
    // A client that connects and says nothing does not block the others.
    let _stalled = UnixStream::connect(d.socket())?;
    let (ok, _) = wbctl(&d, &["devices"])?;
    assert!(ok, "a stalled client blocked the daemon");

    // The whole pipeline, or its dd keeps the filesystem busy.
    unsafe { libc::kill(-(writer.id() as i32), libc::SIGKILL) };
    writer.wait()?;
    let log = d.stop()?;
    assert!(log.contains("policies reloaded"), "{log}");
    let out = Command::new(bin_dir().join("wbctl")).args(["--socket", "/run/wb-no-such.sock", "status"]).output()?;
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && e.contains("not running"), "{e}");
    Ok(())
}

/// A daemon serving metrics on a free loopback port, and that address.
fn metrics_daemon() -> Result<(Daemon, String)> {
    // A free loopback port: bind, note it, let go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let addr = format!("127.0.0.1:{port}");
    let d = Daemon::start_with_args(&["--metrics-listen", &addr])?;
    std::thread::sleep(Duration::from_millis(1200));
    Ok((d, addr))
}

/// The whole answer to `GET path`, waiting at most 3 s for it.
fn http_get(addr: &str, path: &str) -> Result<String> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())?;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut s, &mut out)?;
    Ok(out)
}

/// The same OpenMetrics text over HTTP when asked for, 404 for anything else.
#[test]
fn metrics_listen_serves_openmetrics() -> Result<()> {
    require_root();
    let (d, addr) = metrics_daemon()?;
    let get = |path: &str| http_get(&addr, path);
    let ok = get("/metrics")?;
    assert!(ok.starts_with("HTTP/1.1 200") && ok.contains("application/openmetrics-text"), "{ok}");
    let body = ok.split("\r\n\r\n").nth(1).unwrap_or_default();
    assert!(body.contains("writebehindd_uptime_seconds") && body.ends_with("# EOF\n"), "{body}");
    assert!(get("/secrets")?.starts_with("HTTP/1.1 404"));
    d.stop()?;
    Ok(())
}

/// A user holding the metrics listener's connections open (each for up to
/// 10 s before it says anything) took every slot: root's scrape got no
/// answer.  Local peers are counted by the uid that owns their socket, a
/// few slots each, as on the control socket.
#[test]
fn a_user_holding_metrics_connections_leaves_root_its_scrape() -> Result<()> {
    require_root();
    let (d, addr) = metrics_daemon()?;
    let port = addr.rsplit(':').next().unwrap_or_default().to_owned();
    let script = "import socket, sys, time\n\
                  held = [socket.create_connection(('127.0.0.1', int(sys.argv[1]))) for _ in range(64)]\n\
                  print('held', flush=True)\n\
                  time.sleep(30)\n";
    let mut hog = as_nobody("/usr/bin/python3").args(["-c", script, &port]).stdout(Stdio::piped()).spawn()?;
    let mut line = String::new();
    BufReader::new(hog.stdout.take().unwrap()).read_line(&mut line)?;
    std::thread::sleep(Duration::from_millis(300));
    let scrape = http_get(&addr, "/metrics");
    hog.kill()?;
    hog.wait()?;
    let log = d.stop()?;
    assert_eq!(line, "held\n", "the hog could not connect");
    let scrape = scrape.unwrap_or_else(|e| format!("{e:#}"));
    assert!(scrape.starts_with("HTTP/1.1 200"), "root's scrape beside nobody's 64 connections: {scrape}\n{log}");
    Ok(())
}

/// The control group is checked against the groups the peer had when it
/// connected (SO_PEERGROUPS), not those of whatever process has its pid
/// when the daemon looks (/proc/<pid>/status): a member that connects and
/// hands the connection to a child before the daemon accepts it is still a
/// member.  The daemon is stopped (SIGSTOP) while the member connects and
/// exits, so that the accept comes after; read from /proc, the gone
/// process's groups made it an outsider.
#[test]
fn a_group_member_s_connection_outlives_its_process() -> Result<()> {
    require_root();
    let d = Daemon::start_with_args(&["--control-group", "4243"])?;
    let script = "import os, socket, sys, time\n\
                  s = socket.socket(socket.AF_UNIX)\n\
                  s.connect(sys.argv[1])\n\
                  if os.fork():\n    os._exit(0)\n\
                  time.sleep(1)\n\
                  s.sendall(b'{\"v\":1,\"cmd\":\"status\"}\\n')\n\
                  print(s.makefile().readline()[:40], flush=True)\n";
    let stop = |sig: &str| run(Command::new("kill").arg(sig).arg(d.pid().to_string()));
    stop("-STOP")?;
    let mut member = Command::new("setpriv")
        .args(["--reuid=4242", "--regid=4242", "--groups=4243", "--"])
        .args(["/usr/bin/python3", "-c", script])
        .arg(d.socket())
        .stdout(Stdio::piped())
        .spawn()?;
    let exited = member.wait();
    stop("-CONT")?;
    exited?;
    let mut text = String::new();
    std::io::Read::read_to_string(member.stdout.as_mut().unwrap(), &mut text)?;
    let log = d.stop()?;
    assert!(text.contains("\"ok\":true"), "a member's connection refused: {text:?}\n{log}");
    Ok(())
}

#[test]
fn unit_file_verifies() -> Result<()> {
    // systemd-analyze checks the unit's syntax and that ExecStart exists:
    // point a copy at the built binary.
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../systemd/writebehindd.service"))?;
    let dir = Scratch::new("unit")?;
    let exe = bin_dir().join("writebehindd");
    let path = dir.0.join("writebehindd.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/writebehindd", &exe.display().to_string()))?;
    let out = Command::new("systemd-analyze").arg("verify").arg(&path).output()?;
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && !text.contains("writebehindd.service:"), "systemd-analyze verify:\n{text}");
    Ok(())
}

#[test]
fn install_and_uninstall_under_a_root() -> Result<()> {
    require_root();
    let dir = Scratch::new("install")?;
    let root = dir.0.display().to_string();
    let xtask = |cmd: &str| -> Result<()> {
        let st = Command::new(env!("CARGO"))
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .args(["xtask", cmd, "--root", &root])
            .stdout(Stdio::null())
            .status()?;
        if !st.success() {
            bail!("cargo xtask {cmd} failed");
        }
        Ok(())
    };
    xtask("install")?;
    for f in ["usr/local/bin/writebehindd", "usr/local/bin/wbctl", "etc/systemd/system/writebehindd.service"] {
        assert!(dir.0.join(f).exists(), "{f} not installed");
    }
    assert!(
        std::fs::read_to_string(dir.0.join("usr/local/share/bash-completion/completions/wbctl"))?.contains("wbctl")
    );
    xtask("uninstall")?;
    assert!(!dir.0.join("usr/local/bin/wbctl").exists() && !dir.0.join("etc/writebehindd").exists());
    Ok(())
}

/// An unprivileged writer gets write-behind of its own streaming file and
/// nothing else: every event the daemon acted on names that file.
#[test]
fn an_unprivileged_writer_moves_only_its_own_file() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::new(512)?, "ext4")?;
    let dir = nobodys_dir(&fs)?;
    let daemon = Daemon::start_traced("window = \"8MiB\"\nburst = \"4MiB\"\n", &[], &[])?;
    let file = dir.join("own");
    // setpriv execs dd: the child's pid is the writer's.
    let mut dd = as_nobody("dd")
        .args(["if=/dev/zero", "bs=1M", "count=64", "status=none"])
        .arg(format!("of={}", file.display()))
        .spawn()?;
    let pid = dd.id();
    assert!(dd.wait()?.success());
    std::thread::sleep(Duration::from_millis(300));
    let log = daemon.stop()?;
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(&file)?.ino();
    let events: Vec<&str> =
        log.lines().filter(|l| l.contains(" event ") && l.contains(&format!(" pid={pid} "))).collect();
    assert!(events.len() >= 7, "the unprivileged stream was not flushed:\n{log}");
    assert!(events.iter().all(|l| l.contains(&format!(" ino={ino} "))), "an event for another file:\n{log}");
    Ok(())
}

/// A process name an unprivileged user chose reaches root's terminal only
/// escaped: clear screen, set the window title, an 8-bit CSI and a newline,
/// 15 bytes, all a comm holds.
#[test]
fn hostile_process_names_are_printed_escaped() -> Result<()> {
    require_root();
    const COMM: &str = "\x1b[2J\x1b]0;pwn\x07\u{9b}\n";
    const SHOWN: &str = r"\x1b[2J\x1b]0;pwn\x07\u{9b}\n";
    let fs = Mounted::new(LoopDevice::new(1024)?, "ext4")?;
    let file = nobodys_dir(&fs)?.join("stream");
    let d = Daemon::start_with_policy("burst = \"4MiB\"\n")?;
    // Names itself (PR_SET_NAME), then streams about 20 MiB/s until killed.
    let hex: String = COMM.bytes().map(|b| format!("{b:02x}")).collect();
    let script = format!(
        "import ctypes, sys, time\n\
         ctypes.CDLL(None).prctl(15, bytes.fromhex('{hex}'), 0, 0, 0)\n\
         f = open(sys.argv[1], 'wb', buffering=0)\n\
         while True:\n    f.write(bytes(1 << 20)); time.sleep(0.05)\n"
    );
    let mut writer = as_nobody("/usr/bin/python3").args(["-c", &script]).arg(&file).spawn()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let text = loop {
        let out = d.wbctl().arg("status").output()?;
        if out.stdout.windows(3).any(|w| w == b"pwn") || std::time::Instant::now() > deadline {
            break out.stdout;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    let json = d.wbctl().args(["--json", "streams"]).output()?;
    writer.kill()?;
    writer.wait()?;
    d.stop()?;

    let shown = String::from_utf8_lossy(&text);
    assert!(shown.contains(SHOWN), "the stream's name is not shown escaped:\n{}", shown.escape_debug());
    for (what, out) in [("status", &text), ("--json streams", &json.stdout)] {
        assert_eq!(
            raw_controls(out),
            Vec::<u8>::new(),
            "wbctl {what} printed raw control bytes:\n{}",
            String::from_utf8_lossy(out)
        );
    }
    let streams: serde_json::Value = serde_json::from_slice(&json.stdout)?;
    assert!(
        streams.as_array().is_some_and(|a| a.iter().any(|s| s["comm"] == COMM)),
        "JSON must keep the name:\n{streams}"
    );
    Ok(())
}

/// The control bytes in a program's output, other than its own line ends:
/// C0, DEL and C1 (U+0080..U+009F, encoded C2 80..C2 9F).
fn raw_controls(out: &[u8]) -> Vec<u8> {
    let c1 = out.windows(2).filter(|w| w[0] == 0xc2 && (0x80..0xa0).contains(&w[1])).map(|w| w[1]);
    out.iter().copied().filter(|&b| (b < 0x20 && b != b'\n') || b == 0x7f).chain(c1).collect()
}

/// A user who may read (here: nobody, in the control group) and opens 200
/// connections holds a few client slots, not all of them: root's wbctl still
/// answers at once.  A user who may not read is turned away at once, told how
/// to get access.
#[test]
fn a_user_holding_connections_does_not_lock_root_out() -> Result<()> {
    require_root();
    let d = Daemon::start_with_args(&["--control-group", "65534"])?;
    let (ok, e) = wbctl_as_nobody(&d, &["status"])?;
    assert!(ok, "the control group may read: {e}");
    let (ok, e) = wbctl_as_nobody(&d, &["reload"])?;
    assert!(!ok && e.contains("reload needs root"), "{e}");

    let script = "import socket, sys, time\n\
                  held = [socket.socket(socket.AF_UNIX) for _ in range(200)]\n\
                  for s in held: s.connect(sys.argv[1])\n\
                  print('held', flush=True)\n\
                  time.sleep(60)\n";
    let mut hog = as_nobody("/usr/bin/python3").args(["-c", script]).arg(d.socket()).stdout(Stdio::piped()).spawn()?;
    let mut line = String::new();
    BufReader::new(hog.stdout.take().unwrap()).read_line(&mut line)?;
    assert_eq!(line, "held\n", "the hog could not connect");
    // Asked while nobody holds its connections; checked once it let go.
    let mut answers = Vec::new();
    for _ in 0..3 {
        let asked = std::time::Instant::now();
        answers.push((wbctl(&d, &["status"])?, asked.elapsed()));
    }
    let over_share = wbctl_as_nobody(&d, &["status"])?;
    // Another user, outside the group.
    let asked = std::time::Instant::now();
    let outsider = Command::new("setpriv")
        .args(["--reuid=4242", "--regid=4242", "--clear-groups", "--"])
        .arg(bin_dir().join("wbctl"))
        .arg("--socket")
        .arg(d.socket())
        .arg("status")
        .output()?;
    let refused_in = asked.elapsed();
    hog.kill()?;
    hog.wait()?;
    d.stop()?;

    for ((ok, out), took) in answers {
        assert!(ok && out.contains("backend"), "root locked out by nobody's connections: {out}");
        assert!(took < Duration::from_secs(2), "root waited {took:?}");
    }
    let (ok, e) = over_share;
    assert!(!ok && e.contains("too many connections from uid 65534"), "{e}");
    let e = String::from_utf8_lossy(&outsider.stderr);
    assert!(!outsider.status.success() && e.contains("members of group nogroup (gid 65534)"), "{e}");
    assert!(refused_in < Duration::from_secs(2), "refusing took {refused_in:?}");
    Ok(())
}
