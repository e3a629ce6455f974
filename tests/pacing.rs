//! Pacing through the bdi's own dirty limits: set while a streaming writer is
//! active, the administrator's values back afterwards — after a clean stop,
//! and after kill -9 at the next start or by `writebehindd
//! --restore` — and hands off once an administrator changes them.  One
//! instance at a time: a second one, or `--restore`, refuses while one runs.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::Result;
use wb_tests::{daemon::run_writebehindd, *};
use writebehindd::pacing::JOURNAL;

/// A streaming writer: `size` (head -c's syntax) of zeros at 150 MiB/s,
/// killed with its whole pipeline when dropped.
fn writer(fs: &Mounted, size: &str) -> Result<Background> {
    Background::sh(&format!("head -c {size} /dev/zero | pv -qL 150m > {}", fs.path("stream").display()))
}

/// Whatever happens in a test, it leaves the device's pacing knobs as it
/// found them: their values, and the guards that put them back.
fn keep(knobs: &BdiKnobs) -> Result<((String, String), [Knob; 2])> {
    let original = knobs.values();
    let guards = [
        Knob::set(&format!("{}/max_ratio_fine", knobs.dir), &original.0)?,
        Knob::set(&format!("{}/strict_limit", knobs.dir), &original.1)?,
    ];
    println!("  original max_ratio_fine={} strict_limit={}", original.0, original.1);
    Ok((original, guards))
}

#[test]
fn bdi_limits_are_set_while_streaming_and_restored() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::new(2048)?, "ext4")?;
    let knobs = BdiKnobs::of(&fs)?;
    let (original, _guards) = keep(&knobs)?;

    // Set while streaming, restored by a clean stop (the writer still runs).
    let daemon = Daemon::start()?;
    let mut w = writer(&fs, "1536M")?;
    knobs.wait_for("1", "while streaming")?;
    println!("  paced: max_bytes={}", knobs.get("max_bytes"));
    let log = daemon.stop()?;
    assert_eq!(knobs.values(), original, "a clean stop restores the limits:\n{log}");
    assert!(log.contains("pacing on") && log.contains("bdi limits restored"), "{log}");
    w.wait()?;

    // kill -9 leaves them set; the next start puts them back.
    let daemon = Daemon::start()?;
    let mut w = writer(&fs, "1536M")?;
    knobs.wait_for("1", "second run")?;
    daemon.kill()?;
    w.wait()?;
    assert_eq!(knobs.get("strict_limit"), "1", "a killed daemon cannot restore");
    let daemon = Daemon::start()?;
    assert_eq!(knobs.values(), original, "the next start restores what a killed run left");
    let log = daemon.stop()?;
    assert!(log.contains("left set by a previous run"), "{log}");

    // An administrator's change wins: the daemon stops pacing and leaves it.
    let daemon = Daemon::start()?;
    let mut w = writer(&fs, "1536M")?;
    knobs.wait_for("1", "third run")?;
    std::fs::write(format!("{}/strict_limit", knobs.dir), "0")?;
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(knobs.get("strict_limit"), "0", "the daemon must not undo the administrator");
    let log = daemon.stop()?;
    w.wait()?;
    assert!(log.contains("changed by someone else"), "{log}");
    assert_eq!(knobs.get("strict_limit"), "0", "nor restore over the administrator at exit");
    Ok(())
}

/// A second instance started by mistake, and `--restore` while a daemon
/// runs, refuse at once, naming the running one, and touch nothing: the
/// first keeps pacing (it would step aside had its knobs been put back
/// under it) and restores the administrator's values when it stops.
#[test]
fn a_second_instance_and_restore_refuse_while_one_runs() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::new(2048)?, "ext4")?;
    let knobs = BdiKnobs::of(&fs)?;
    let (original, _guards) = keep(&knobs)?;
    let daemon = Daemon::start()?;
    let _w = writer(&fs, "1536M")?;
    knobs.wait_for("1", "while streaming")?;

    // Like the test daemon, never the host's policies or control socket.
    let scratch = Scratch::new("second")?;
    let (dir, sock) = (scratch.0.display().to_string(), scratch.0.join("control.sock").display().to_string());
    for args in [vec!["--policy-dir", &dir, "--control", &sock], vec!["--restore"]] {
        let (status, out) = run_writebehindd(&args, Duration::from_secs(5))?;
        println!("  writebehindd {args:?}: {status}: {}", out.trim());
        assert!(!status.success(), "{args:?} ran beside a running daemon:\n{out}");
        assert!(out.contains("already running") && out.contains(&daemon.pid().to_string()), "{out}");
        assert_eq!(knobs.get("strict_limit"), "1", "{args:?} touched the running daemon's knobs:\n{out}");
        assert!(Path::new(JOURNAL).exists(), "{args:?} removed the running daemon's journal:\n{out}");
    }
    // The first one still paces: a knob put back under it would have made
    // it step aside at its next look.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(knobs.get("strict_limit"), "1");
    let log = daemon.stop()?;
    assert!(!log.contains("changed by someone else"), "{log}");
    assert_eq!(knobs.values(), original, "the first daemon restores at its stop:\n{log}");
    Ok(())
}

/// After kill -9 (systemd's SIGKILL at its stop timeout), `writebehindd
/// --restore` puts the administrator's values back and removes the journal;
/// with nothing journaled (after a clean stop) it does nothing, successfully.
#[test]
fn restore_after_kill_puts_the_values_back() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::new(2048)?, "ext4")?;
    let knobs = BdiKnobs::of(&fs)?;
    let (original, _guards) = keep(&knobs)?;
    let daemon = Daemon::start()?;
    let _w = writer(&fs, "1536M")?;
    knobs.wait_for("1", "while streaming")?;
    let log = daemon.kill()?;
    assert_eq!(knobs.get("strict_limit"), "1", "a killed daemon cannot restore:\n{log}");
    assert!(Path::new(JOURNAL).exists(), "a killed pacing daemon leaves its journal:\n{log}");

    let (status, out) = run_writebehindd(&["--restore"], Duration::from_secs(5))?;
    println!("  --restore: {}", out.trim());
    assert!(status.success(), "--restore failed ({status}):\n{out}");
    assert_eq!(knobs.values(), original, "--restore puts the values back:\n{out}");
    assert!(!Path::new(JOURNAL).exists(), "--restore leaves no journal:\n{out}");

    let (status, out) = run_writebehindd(&["--restore"], Duration::from_secs(5))?;
    assert!(status.success() && out.contains("nothing to restore"), "{status}:\n{out}");
    assert_eq!(knobs.values(), original);
    Ok(())
}

/// strace, killing the daemon on entering its `n`th write(2) to the knobs
/// at `paths` (that write does not happen, the ones before it did), and
/// logging those writes to `trace` (-y: with their paths); the daemon's
/// command or `-p PID` follows.
fn strace_killing_at(n: u32, paths: &[String], trace: &Path) -> Vec<String> {
    let mut a: Vec<String> = ["strace", "-f", "-qq", "-y", "-e", "trace=write"].map(String::from).into();
    a.extend(["-e".into(), format!("inject=write:signal=SIGKILL:when={n}"), "-o".into(), trace.display().to_string()]);
    for p in paths {
        a.extend(["-P".into(), p.clone()]);
    }
    a
}

/// After the daemon was killed at a knob write: `--restore` puts the
/// administrator's values back.
fn restores_after_kill(knobs: &BdiKnobs, original: &(String, String), trace: &Path, log: &str) -> Result<()> {
    let killed_at = std::fs::read_to_string(trace)?.lines().rfind(|l| l.contains("write(")).unwrap_or("").to_owned();
    let (status, out) = run_writebehindd(&["--restore"], Duration::from_secs(5))?;
    println!("  killed at {killed_at}\n  --restore: {}", out.trim().replace('\n', "\n    "));
    assert!(status.success(), "--restore failed ({status}):\n{out}");
    assert_eq!(&knobs.values(), original, "killed at {killed_at}: not restored:\n{log}\n--restore:\n{out}");
    Ok(())
}

/// Killed at any knob write — a pace's, a re-pace's, a release's — the
/// daemon had journaled beforehand what the knobs may hold, and `--restore`
/// puts the administrator's values back.  strace kills it at the same
/// write every run, whatever the timing: the first four writes after its
/// start (a pace and a re-pace or two), then, attached to a pacing daemon,
/// the second write of the release at its stop.
#[test]
fn killed_at_any_knob_write_the_values_come_back() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::new(2048)?, "ext4")?;
    let knobs = BdiKnobs::of(&fs)?;
    let (original, _guards) = keep(&knobs)?;
    // strace matches an fd's path as /proc shows it: the real one, not the
    // /sys/class/bdi symlink.
    let mut paths = Vec::new();
    for name in ["max_bytes", "max_ratio_fine", "strict_limit"] {
        paths.push(std::fs::canonicalize(format!("{}/{name}", knobs.dir))?.display().to_string());
    }
    let scratch = Scratch::new("strace")?;
    let trace = scratch.0.join("knob-writes");

    for n in 1..=4 {
        let mut strace = strace_killing_at(n, &paths, &trace);
        strace.push("--".into());
        let strace: Vec<&str> = strace.iter().map(String::as_str).collect();
        let mut daemon = Daemon::start_wrapped(&strace, None)?;
        let _w = writer(&fs, "512M")?;
        let status = daemon.wait_exit(Duration::from_secs(30))?;
        let log = daemon.log_text();
        assert!(!status.success(), "knob write {n}: the daemon was not killed ({status}):\n{log}");
        restores_after_kill(&knobs, &original, &trace, &log)?;
    }

    // The release at a stop: attached once the device is paced, the
    // first write is the ceiling put back, the second strict_limit.
    let mut daemon = Daemon::start()?;
    let _w = writer(&fs, "1536M")?;
    knobs.wait_for("1", "while streaming")?;
    let pid = daemon.pid().to_string();
    let mut strace = strace_killing_at(2, &paths, &trace);
    strace.extend(["-p".into(), pid.clone()]);
    let mut strace = Command::new(&strace[0]).args(&strace[1..]).stdin(Stdio::null()).spawn()?;
    let traced = || -> Result<bool> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        Ok(status.lines().any(|l| l.starts_with("TracerPid:") && l.split_whitespace().nth(1) != Some("0")))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !traced()? {
        if let Some(st) = strace.try_wait()? {
            anyhow::bail!("strace -p {pid} exited ({st}) before attaching");
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "strace -p {pid} not attached after 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGTERM) };
    let status = daemon.wait_exit(Duration::from_secs(20))?;
    strace.wait()?;
    let log = daemon.log_text();
    assert!(!status.success(), "the daemon was not killed in its release ({status}):\n{log}");
    restores_after_kill(&knobs, &original, &trace, &log)
}

/// A copy that has finished no longer counts as a writer of its device: the
/// next writer gets one writer's dirty budget, not stream_dirty twice over.
/// A finished cp -r counted for 5 s more (WRITER_IDLE): gio copying to a
/// USB stick right after one was held at 28 MiB instead of 14, and its
/// `sync` took 1.01 s instead of 0.39 (systest on 6.12, CI).
#[test]
fn a_finished_copy_no_longer_counts_as_a_writer() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::throttled(256, 40 * MIB)?, "ext4")?;
    let knobs = BdiKnobs::of(&fs)?;
    let (_original, _guards) = keep(&knobs)?;
    let src = Scratch::new_in("/dev/shm", "finished-copy")?;
    random_tree(&src.0, 16, MIB, 2 * MIB, 5)?;
    // One writer's budget: the largest of 0.1 s of 40 MiB/s and four
    // windows, 8 MiB; two writers': two stream_dirty, 128 MiB.
    let daemon = Daemon::start_with_policy("window = \"2MiB\"\nstream_dirty = \"64MiB\"\n")?;
    sh(&format!("cp -r {} {}", src.0.display(), fs.path("copy").display()))?;
    let _w = writer(&fs, "160M")?;
    knobs.wait_for("1", "while streaming")?;
    let mut most = 0u64;
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        most = most.max(knobs.get("max_bytes").parse()?);
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = daemon.stop()?;
    println!("  largest max_bytes while streaming after the copy: {} MiB", most / MIB);
    assert!(log.lines().any(|l| l.contains("multi-file writer ended") && l.contains("exited")), "{log}");
    assert!(most <= 32 * MIB, "the finished copy still counted as a writer: max_bytes up to {most}:\n{log}");
    Ok(())
}

/// On a paced device a writer's small closed files are left to the kernel's
/// flusher, which the cap keeps writing only down to about half the
/// budget.  Once the device is released nothing is over any threshold and
/// the rest would wait for dirty_expire (30 s) after the copy looked done:
/// the agent writes back the writer's latest files when it ends.
#[test]
fn files_left_to_the_kernel_are_written_when_their_writer_ends() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::throttled(256, 40 * MIB)?, "ext4")?;
    let bdi = fs.bdi()?;
    let src = Scratch::new_in("/dev/shm", "left-files")?;
    random_tree(&src.0.join("t"), 2000, 4096, 32 * 1024, 7)?;
    // Dirty on the device 4 s after the copy (the 2 s linger and more).
    let dirty_after = |dst: &str| -> Result<u64> {
        sh(&format!("cp -r {} {}", src.0.join("t").display(), fs.path(dst).display()))?;
        let sampler = Sampler::start(&bdi)?;
        std::thread::sleep(Duration::from_secs(4));
        Ok(sampler.series().last().map_or(0, |s| s.dirty))
    };
    let default = dirty_after("default")?;
    sh("sync")?;
    let daemon = Daemon::start_with_policy("burst = \"1MiB\"\n")?;
    let held = dirty_after("daemon")?;
    let log = daemon.stop()?;
    let left = stopped_counter(&log, "closed_files_left");
    println!(
        "  dirty 4 s after cp -r of 2000 files: {} KiB without the daemon, {} KiB with it ({left} files left to the kernel)",
        default / 1024,
        held / 1024
    );
    assert!(left > 0, "no file was left to the kernel:\n{log}");
    assert!(default > 8 * MIB, "without the daemon only {default} bytes stayed dirty: the test shows nothing");
    assert!(held < MIB, "{held} bytes still dirty 4 s after the copy:\n{log}");
    Ok(())
}

/// A daemon killed while its flusher waits in the kernel on a stalled device
/// (a FUSE-backed loop device that stopped answering, a dying stick; here the
/// device's cap cut to 4 KiB/s) cannot finish exiting, and its lock stayed
/// held for as long as the device stalled: `--restore` (the unit's
/// ExecStopPost) and every restart were refused, and the device kept
/// `strict_limit`.  Both now take over from such a holder.
#[test]
fn a_daemon_killed_while_stuck_in_the_kernel_gives_way() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::throttled(2048, 80 << 20)?, "ext4")?;
    let knobs = BdiKnobs::of(&fs)?;
    let (original, _guards) = keep(&knobs)?;
    let mut daemon = Daemon::start()?;
    let _w = writer(&fs, "1536M")?;
    knobs.wait_for("1", "while streaming")?;
    // Dropped before the daemon: the stuck thread and the test's exit need
    // the device to drain, whatever fails below.
    let _unstall = Unstall(&fs.device);
    fs.device.set_write_rate(4096)?;
    let pid = daemon.pid();
    wait_until(
        "a daemon thread waiting in D state",
        Duration::from_secs(20),
        || Ok(thread_states(pid).contains(&'D')),
    )?;
    daemon.sigkill();
    wait_until("the killed daemon's main thread gone", Duration::from_secs(10), || {
        Ok(thread_states(pid).first() == Some(&'Z'))
    })?;
    println!("  killed daemon's threads: {:?}", thread_states(pid));

    let (status, out) = run_writebehindd(&["--restore"], Duration::from_secs(10))?;
    println!("  --restore: {}", out.trim());
    assert!(status.success(), "--restore refused beside a dying daemon ({status}):\n{out}");
    assert!(out.contains(&format!("pid {pid} was killed")), "{out}");
    assert_eq!(knobs.values(), original, "--restore puts the values back:\n{out}");
    // The next start beside it, its writers left alone: one that streamed
    // the writer still writing to the stalled device would have its own
    // flusher stuck there (measured: `stream started` 60 ms after attach,
    // then a SIGTERM it could not finish for 20 s), which is that device's
    // doing, not the dying daemon's.
    let next = Daemon::start_with_policy("mode = \"off\"\n")?;
    let log = next.stop()?;
    assert!(log.contains("attached"), "{log}");
    assert_eq!(thread_states(pid).first(), Some(&'Z'), "the device drained during the test: it proves nothing");

    drop(_unstall);
    daemon.wait_exit(Duration::from_secs(60))?;
    Ok(())
}

/// Lifts a stalled device's cap when dropped.
struct Unstall<'a>(&'a LoopDevice);

impl Drop for Unstall<'_> {
    fn drop(&mut self) {
        let _ = self.0.set_write_rate(0);
    }
}

/// The state letter of each thread of `pid`, its main thread first; empty
/// once it is gone.
fn thread_states(pid: u32) -> Vec<char> {
    let state = |stat: String| stat.rsplit_once(')').and_then(|(_, r)| r.trim_start().chars().next());
    let main = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(state);
    let others = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|t| t.file_name().to_string_lossy() != pid.to_string())
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok().and_then(state));
    main.into_iter().chain(others).collect()
}

/// Forty writers, each at 0.9 MiB/s (under a sixteenth of a 30 MiB/s
/// device, the least a writer must dirty to count for pacing on its own),
/// together outrun the device (36 MiB/s): it stays paced.  Counted one by
/// one they were not, once each one's first window had passed.
#[test]
fn many_slow_writers_together_are_paced() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::throttled(2048, 30 << 20)?, "ext4")?;
    let knobs = BdiKnobs::of(&fs)?;
    let (_original, _guards) = keep(&knobs)?;
    let daemon = Daemon::start_with_policy("window = \"1MiB\"\nburst = \"1MiB\"\n")?;
    let d = fs.dir.display();
    let _w =
        Background::sh(&format!("for i in $(seq 40); do head -c 64M /dev/zero | pv -qL 900k > {d}/s$i & done; wait"))?;
    // Past every stream's first window, which counts on its own.
    std::thread::sleep(Duration::from_secs(4));
    let (t0, mut unpaced) = (Instant::now(), Duration::ZERO);
    while t0.elapsed() < Duration::from_secs(5) {
        if knobs.get("strict_limit") != "1" {
            unpaced += Duration::from_millis(100);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = daemon.stop()?;
    println!("unpaced for {unpaced:?} of 5 s while forty slow writers outran the device");
    assert!(unpaced < Duration::from_secs(1), "not paced for {unpaced:?} of 5 s:\n{log}");
    Ok(())
}
