//! `bench --only cost`: what watching costs, side by side with no daemon (the
//! kernel default).  Per call where nothing streams (a write, an unrelated
//! syscall, a syscall-heavy program: the hooks' price, paid in the caller);
//! the agent's CPU and memory where something does (one big file, many small
//! ones, 1,000 streams); how many events it handles when closes come as fast
//! as one process can make them; the goals it is held to last.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use wb_tests::{Daemon, LoopDevice, MIB, Mounted, Sample, Sampler, Scratch, cpu_secs, sampler::peak, sh};

mod goals;
mod streams;

use super::{
    modes::{self, Mode},
    report::{self, Run},
    scenarios::{self, Ctx, Metrics, Sizes},
    socket,
};

/// The flood measures the agent, not the device: paced (the default), its
/// writer would wait for a 100 MiB/s device long before the agent is busy.
const FLOOD_POLICY: &str = "pacing=false";
/// One process made 39,000 files/s here without the daemon, under the goal's
/// 50,000; two make 74,000.
const FLOOD_WRITERS: u32 = 2;

/// 1,000 streams of a few MiB each stream only with a burst and window below
/// their size (the default burst is 16 MiB: 1,000 × 17 MiB would take minutes
/// at 100 MiB/s); the same policy as tests/reliability.rs.
const STREAMS_POLICY: &str = "burst=\"1MiB\"+window=\"1MiB\"";

/// 4 KiB writes per pass over the same bytes: 1 MiB, under the smallest
/// window (2 MiB), so the daemon sees every write and has nothing to flush.
const REGION: u64 = 256;

#[derive(Debug, Clone)]
pub struct CostSizes {
    /// Seconds of each per-call loop, and at least this many runs of them
    /// (cheap, and the noisiest numbers).
    pub micro_secs: f64,
    pub micro_runs: u32,
    /// Timed `find /usr -xdev` per run (their median is the run's value).
    pub find_reps: u32,
    pub copy_mib: u64,
    pub tar_files: u32,
    pub flood_files: u32,
    pub streams: u32,
    pub stream_mib: u64,
    /// The `devices` part: the streams spread over this many devices,
    /// each writing SPREAD_MIB at this many KiB/s.
    pub devices: u32,
    pub spread_kib_s: u64,
}

impl CostSizes {
    pub fn full() -> Self {
        Self {
            micro_secs: 1.0,
            micro_runs: 5,
            find_reps: 3,
            copy_mib: 3072,
            tar_files: 30_000,
            flood_files: 50_000,
            streams: 1000,
            stream_mib: 2,
            devices: 32,
            spread_kib_s: 256,
        }
    }

    pub fn quick() -> Self {
        Self { micro_secs: 0.5, micro_runs: 3, find_reps: 3, copy_mib: 1024, ..Self::full() }
    }

    pub fn smoke() -> Self {
        Self {
            micro_secs: 0.2,
            micro_runs: 1,
            find_reps: 1,
            copy_mib: 64,
            tar_files: 300,
            flood_files: 2000,
            streams: 20,
            stream_mib: 2,
            devices: 2,
            spread_kib_s: 1024,
        }
    }

    /// Seconds at `rate_mib`: each byte twice (once per mode) at the device
    /// rate, plus a fixed share per part for daemon starts and settling.
    pub fn estimate_secs(&self, rate_mib: u64, runs: u32) -> f64 {
        let mib = self.copy_mib + self.tar_files as u64 * 17 / 2048 + (self.streams as u64 * self.stream_mib);
        let spread = (streams::SPREAD_MIB * 1024 / self.spread_kib_s) as f64 + self.devices as f64 * 0.3;
        let per_run = 2.0 * mib as f64 / rate_mib as f64 + 4.0 * 8.0 + 2.0 * spread;
        let micro = self.micro_runs.max(runs) as f64 * 2.0 * (3.0 * self.micro_secs + self.find_reps as f64 + 4.0);
        per_run * runs as f64 + micro + 30.0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    PerCall,
    Copy,
    Tar,
    Flood,
    Streams,
    Devices,
}

/// The parts' names for --parts, in order.
pub fn parts() -> Vec<&'static str> {
    Part::ALL.map(Part::name).to_vec()
}

impl Part {
    const ALL: [Part; 6] = [Part::PerCall, Part::Copy, Part::Tar, Part::Flood, Part::Streams, Part::Devices];

    /// Its name for --parts.
    fn name(self) -> &'static str {
        match self {
            Part::PerCall => "per-call",
            Part::Copy => "copy",
            Part::Tar => "tar",
            Part::Flood => "flood",
            Part::Streams => "streams",
            Part::Devices => "devices",
        }
    }

    fn group(self, s: &CostSizes) -> String {
        match self {
            Part::PerCall => "cost: per call, nothing streaming".into(),
            Part::Copy => format!("cost: cp of one {:.1} GiB file", s.copy_mib as f64 / 1024.0),
            Part::Tar => format!("cost: tar x of {} files of 1-16 KiB", s.tar_files),
            Part::Flood => {
                format!("cost: {} closed files of 1 KiB, as fast as {FLOOD_WRITERS} processes can", s.flood_files)
            }
            Part::Streams => format!("cost: {} concurrent dd streams x {} MiB", s.streams, s.stream_mib),
            Part::Devices => format!("cost: {} streams over {} devices", s.streams, s.devices),
        }
    }

    fn daemon_mode(self) -> Mode {
        match self {
            Part::Streams | Part::Devices => Mode::Writebehindd(Some(STREAMS_POLICY)),
            Part::Flood => Mode::Writebehindd(Some(FLOOD_POLICY)),
            _ => Mode::Writebehindd(None),
        }
    }

    fn run(self, ctx: &Ctx, s: &CostSizes, agent: Option<&Agent>) -> Result<Metrics> {
        match self {
            Part::PerCall => per_call(ctx, s, agent),
            Part::Copy => copy(ctx, agent),
            Part::Tar => tar(ctx, agent),
            Part::Flood => flood(ctx, s, agent),
            Part::Streams => streams::streams(ctx, s, agent),
            Part::Devices => streams::devices(s, agent),
        }
    }
}

/// The whole scenario, on an ext4 device of its own at the plan's first rate.
pub fn run(plan: &super::Plan, daemon: &Path, xtask: &Path, runs: &mut Vec<Run>) -> Result<()> {
    let (s, t) = (&plan.cost, Instant::now());
    let rate_mib = super::cost_rate(plan);
    let shm = Scratch::new_in("/dev/shm", "cost")?;
    let copy_src = shm.0.join("big");
    wb_tests::random_file(&copy_src, s.copy_mib * MIB, 0x5eed)?;
    let tarball = cached_tarball(s.tar_files)?;
    sh(&format!("cat {} > /dev/null", tarball.display()))?; // cached for every run alike
    let dev_mib = s.copy_mib.max(s.streams as u64 * s.stream_mib) * 5 / 4 + s.tar_files as u64 / 32 + 128;
    let fs = Mounted::new(LoopDevice::throttled(dev_mib, rate_mib * MIB)?, "ext4")?;
    let sizes = Sizes { multi_mib: s.stream_mib, ..plan.sizes.clone() };
    let ctx = Ctx {
        fs: &fs,
        rate: rate_mib * MIB,
        sizes: &sizes,
        xtask: xtask.to_owned(),
        copy_src,
        copy_bytes: s.copy_mib * MIB,
        tarball,
    };
    println!("\ncost: ext4 at {rate_mib} MiB/s, daemon built from {}", daemon_source());
    println!("set up in {:.0} s; load average {}", t.elapsed().as_secs_f64(), loadavg());
    for part in Part::ALL.into_iter().filter(|p| plan.cost_parts.iter().any(|name| name == p.name())) {
        measure(part, plan, &ctx, daemon, runs)?;
    }
    print!("{}", goals::goals(runs, s));
    Ok(())
}

/// One part's runs, each mode in turn, and its table.
fn measure(part: Part, plan: &super::Plan, ctx: &Ctx, daemon: &Path, runs: &mut Vec<Run>) -> Result<()> {
    let (s, t) = (&plan.cost, Instant::now());
    let n = if part == Part::PerCall { plan.runs.max(s.micro_runs) } else { plan.runs };
    let group = part.group(s);
    for _ in 0..n {
        for mode in modes_of(plan, part) {
            let active = modes::activate(mode, &ctx.fs.bdi()?, ctx.rate, daemon)?;
            let agent = active.daemon().map(Agent::watch).transpose()?;
            let metrics = part.run(ctx, s, agent.as_ref())?;
            active.stop()?;
            runs.push(Run::new(&group, &mode.name(), &metrics, &[]));
        }
    }
    print!("{}", report::table(runs, &group));
    println!("({n} run(s) in {:.0} s; load average {})", t.elapsed().as_secs_f64(), loadavg());
    Ok(())
}

/// The commit the daemon was built from.  Others edit the daemon in this
/// tree: the binary is HEAD plus whatever they have not committed yet.
pub(super) fn daemon_source() -> String {
    let commit = sh("git rev-parse --short HEAD").unwrap_or_default();
    let dirty = !sh("git status --porcelain agent bpf").unwrap_or_default().trim().is_empty();
    format!("{}{}", commit.trim(), if dirty { " with uncommitted changes in agent/ or bpf/" } else { "" })
}

/// No daemon and the daemon, as far as --modes asks for them.
fn modes_of(plan: &super::Plan, part: Part) -> Vec<Mode> {
    let mut m = Vec::new();
    if plan.modes.contains(&Mode::Default) {
        m.push(Mode::Default);
    }
    if plan.modes.contains(&Mode::Writebehindd(None)) {
        m.push(part.daemon_mode());
    }
    m
}

/// Others' work on the machine shows here (the lock keeps out only benches
/// and tests, not builds).
fn loadavg() -> String {
    let l = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// The small-file tarball, made once and kept under target/ (generating
/// 30,000 files takes longer than extracting them).
fn cached_tarball(files: u32) -> Result<PathBuf> {
    let path = PathBuf::from(format!("target/bench/cache/small-{files}.tar"));
    if path.exists() {
        return Ok(path);
    }
    std::fs::create_dir_all(path.parent().unwrap())?;
    let src = Scratch::new_in("/dev/shm", "cost-tar")?;
    wb_tests::random_tree(&src.0.join("t"), files, 1024, 16 * 1024, 0x7a5)?;
    let tmp = path.with_extension("tmp");
    sh(&format!("tar -cf {} -C {} t", tmp.display(), src.0.display()))?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Runs `cmd` to its end: (wall seconds, CPU seconds of it and the children
/// it waited for, user + system).  wait4, not Child::wait, for its rusage.
fn timed(cmd: &mut Command) -> Result<(f64, f64)> {
    timed_all(&mut [cmd])
}

/// Runs `cmds` at once: seconds until the last exits, and their CPU
/// seconds together.
fn timed_all(cmds: &mut [&mut Command]) -> Result<(f64, f64)> {
    let t = Instant::now();
    let mut children = Vec::new();
    for cmd in cmds.iter_mut() {
        let child =
            cmd.stdin(Stdio::null()).stdout(Stdio::null()).spawn().with_context(|| format!("spawning {cmd:?}"))?;
        children.push(child);
    }
    let secs = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    let mut cpu = 0.0;
    let mut failed = None;
    // Every child is waited for, a failed one or not: none left running.
    for (child, cmd) in children.iter().zip(cmds.iter()) {
        let mut status = 0;
        // SAFETY: rusage is plain data; wait4 fills it for our own child.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) } < 0 {
            let e = std::io::Error::last_os_error();
            failed.get_or_insert_with(|| anyhow::anyhow!("wait4 for {cmd:?}: {e}"));
        } else if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
            failed.get_or_insert_with(|| anyhow::anyhow!("{cmd:?} failed (wait status {status:#x})"));
        }
        cpu += secs(ru.ru_utime) + secs(ru.ru_stime);
    }
    match failed {
        Some(e) => Err(e),
        None => Ok((t.elapsed().as_secs_f64(), cpu)),
    }
}

/// One status snapshot of the daemon (refreshed by it every second).
struct Snapshot {
    uptime: f64,
    counters: BTreeMap<String, u64>,
}

impl Snapshot {
    fn get(&self, key: &str) -> u64 {
        self.counters.get(key).copied().unwrap_or(0)
    }

    /// Closes the agent never acted on: ring buffer full, shed by BPF, or
    /// shed by the agent for waiting too long in the ring.
    fn lost(&self) -> u64 {
        self.get("ring_buffer_drops") + self.get("closes_shed") + self.get("closes_shed_late")
    }
}

/// The daemon of a run, seen from outside: /proc and its control socket.
struct Agent {
    pid: u32,
    socket: PathBuf,
    cpu0: f64,
    start: Snapshot,
}

/// What the agent spent on a part.
struct AgentUse {
    cpu: f64,
    rss_mib: f64,
    events: u64,
    lost: u64,
}

impl Agent {
    /// Counts from now: CPU and counters from here, peak RSS reset (its
    /// start-up, BPF loading included, is not the workload's).
    fn watch(d: &Daemon) -> Result<Self> {
        let pid = d.pid();
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5").context("resetting VmHWM")?;
        let start = status(&d.socket())?;
        Ok(Self { pid, socket: d.socket(), cpu0: cpu_secs(pid)?, start })
    }

    fn cpu(&self) -> Result<f64> {
        Ok(cpu_secs(self.pid)? - self.cpu0)
    }

    /// Waits until the agent is idle (its work can trail the workload's:
    /// queued events, batches of closed files), then takes its account.
    fn finish(&self) -> Result<AgentUse> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let (mut cpu, mut last) = (self.cpu()?, status(&self.socket)?);
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let (c, now) = (self.cpu()?, status(&self.socket)?);
            let idle = c - cpu <= 0.011; // at most one 10 ms tick in 300 ms
            cpu = c;
            if now.uptime > last.uptime {
                let done = now.get("events") == last.get("events") && idle;
                last = now;
                if done || Instant::now() > deadline {
                    break;
                }
            }
        }
        Ok(AgentUse {
            cpu,
            rss_mib: status_kib(self.pid, "VmHWM:")? as f64 / 1024.0,
            events: last.get("events") - self.start.get("events"),
            lost: last.lost() - self.start.lost(),
        })
    }
}

fn status_kib(pid: u32, key: &str) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    s.lines()
        .find_map(|l| l.strip_prefix(key)?.trim().trim_end_matches(" kB").parse().ok())
        .with_context(|| format!("no {key} in /proc/{pid}/status"))
}

/// `status` on the control socket: the counters and uptime.
fn status(socket: &Path) -> Result<Snapshot> {
    let data = socket::status(socket)?;
    Ok(Snapshot {
        uptime: data["uptime_s"].as_f64().unwrap_or(0.0),
        counters: serde_json::from_value(data["counters"].clone())?,
    })
}

/// The agent's common metrics, appended; its account for derived ones.
fn agent_metrics(agent: Option<&Agent>, m: &mut Metrics) -> Result<Option<AgentUse>> {
    let Some(a) = agent else { return Ok(None) };
    let u = a.finish()?;
    m.extend([
        ("agent CPU s", u.cpu),
        ("agent RSS MiB", u.rss_mib),
        ("events", u.events as f64),
        ("lost", u.lost as f64),
    ]);
    Ok(Some(u))
}

fn metric(m: &Metrics, key: &str) -> f64 {
    m.iter().find(|(k, _)| *k == key).map_or(f64::NAN, |(_, v)| *v)
}

/// getppid() in a loop: a syscall the daemon has no interest in, which
/// still passes the syscall tracepoints.
fn getppid_ns(secs: f64) -> f64 {
    let (t, mut n) = (Instant::now(), 0u64);
    while t.elapsed().as_secs_f64() < secs {
        for _ in 0..10_000 {
            // SAFETY: no preconditions.
            std::hint::black_box(unsafe { libc::getppid() });
        }
        n += 10_000;
    }
    t.elapsed().as_secs_f64() * 1e9 / n as f64
}

/// A syscall-heavy real program (an fstatat and more per entry, 160,000
/// entries here), its tree cached by a first run: median seconds.
fn find_secs(reps: u32) -> Result<f64> {
    let mut find = Command::new("find");
    find.args(["/usr", "-xdev"]).stderr(Stdio::null());
    timed(&mut find)?;
    let mut t: Vec<f64> = (0..reps).map(|_| timed(&mut find).map(|(wall, _)| wall)).collect::<Result<_>>()?;
    t.sort_by(|a, b| a.total_cmp(b));
    Ok(t[t.len() / 2])
}

fn per_call(ctx: &Ctx, s: &CostSizes, agent: Option<&Agent>) -> Result<Metrics> {
    let tmpfs = scenarios::overhead_in(Path::new("/dev/shm"), REGION, s.micro_secs, false)?;
    let ext4 = scenarios::overhead_in(&ctx.fs.dir, REGION, s.micro_secs, false)?;
    let fresh = scenarios::overhead_in(&ctx.fs.dir, REGION, s.micro_secs, true)?;
    let mut m = vec![
        ("tmpfs ns/write", metric(&tmpfs, "ns/write")),
        ("ext4 ns/write", metric(&ext4, "ns/write")),
        ("ext4 fresh ns/write", metric(&fresh, "ns/write")),
        ("getppid ns", getppid_ns(s.micro_secs)),
        ("find /usr s", find_secs(s.find_reps)?),
    ];
    if agent.is_some() {
        hook_ns(ctx, s, &mut m)?;
    }
    agent_metrics(agent, &mut m)?;
    Ok(m)
}

/// The hooks the per-call loops run: (program, loop, metric).  The write
/// loop dirties a page per write, so both write hooks of the backend run.
const HOOKS: [(&str, Loop, &str); 4] = [
    ("wb_sys_exit", Loop::Writes, "sys_exit hook ns/write"),
    ("wb_vfs_write", Loop::Writes, "vfs_write hook ns/write"),
    ("wb_dirty_folio", Loop::Writes, "dirty_folio hook ns/run"),
    ("wb_sys_exit", Loop::Getppid, "sys_exit hook ns/other syscall"),
];

#[derive(Clone, Copy, PartialEq)]
enum Loop {
    Writes,
    Getppid,
}

/// Each hook's own time per run, from the kernel's BPF run-time statistics
/// while each loop runs again: the program alone, without the syscall slow
/// path or the dispatch to it (the per-call rows above include those).
/// kernel.bpf_stats_enabled is on only for this: it adds two clock reads
/// per run (most of the ~50 ns the sys_exit hook reads per getppid, for
/// which it only compares the syscall number).
fn hook_ns(ctx: &Ctx, s: &CostSizes, m: &mut Metrics) -> Result<()> {
    let stats = || -> Result<BTreeMap<String, (f64, f64)>> {
        let out = Command::new("bpftool").args(["-j", "prog", "show"]).output().context("running bpftool")?;
        let progs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).context("bpftool -j prog show")?;
        Ok(progs
            .iter()
            .filter_map(|p| {
                // Absent until the program has run with statistics on.
                let n = |k: &str| p.get(k).and_then(serde_json::Value::as_f64).unwrap_or(0.0);
                Some((p.get("name")?.as_str()?.to_owned(), (n("run_time_ns"), n("run_cnt"))))
            })
            .collect())
    };
    let _on = wb_tests::Knob::set("/proc/sys/kernel/bpf_stats_enabled", "1")?;
    for which in [Loop::Writes, Loop::Getppid] {
        let before = stats()?;
        match which {
            Loop::Writes => _ = scenarios::overhead_in(&ctx.fs.dir, REGION, s.micro_secs, true)?,
            Loop::Getppid => _ = getppid_ns(s.micro_secs),
        }
        let after = stats()?;
        for (prog, _, metric) in HOOKS.iter().filter(|h| h.1 == which) {
            if let (Some(b), Some(a)) = (before.get(*prog), after.get(*prog))
                && a.1 > b.1
            {
                m.push((metric, (a.0 - b.0) / (a.1 - b.1)));
            }
        }
    }
    Ok(())
}

/// GNU cp of one big file from tmpfs (read/write across filesystems), synced.
fn copy(ctx: &Ctx, agent: Option<&Agent>) -> Result<Metrics> {
    let dst = ctx.clean("cost-copy")?;
    let busy = scenarios::busy_cpu_secs()?;
    let (secs, cpu) = timed(Command::new("cp").arg(&ctx.copy_src).arg(&dst))?;
    let sync = scenarios::timed_sync()?;
    let mut m = vec![("cp s", secs), ("sync s", sync), ("cp CPU s", cpu)];
    let u = agent_metrics(agent, &mut m)?;
    // % of a core per 100 MiB/s streamed = CPU seconds per 100 MiB × 100.
    let per_100mib = |secs: f64| secs / (ctx.copy_bytes as f64 / (100 * MIB) as f64) * 100.0;
    let all = scenarios::busy_cpu_secs()? - busy;
    m.push(("all CPUs s", all));
    m.push(("all CPUs %core per 100MiB/s", per_100mib(all)));
    if let Some(u) = u {
        m.push(("agent %core per 100MiB/s", per_100mib(u.cpu)));
    }
    ctx.clean("cost-copy")?;
    Ok(m)
}

/// GNU tar x of the small-file tarball, synced.
fn tar(ctx: &Ctx, agent: Option<&Agent>) -> Result<Metrics> {
    let dir = ctx.clean("cost-tar")?;
    std::fs::create_dir_all(&dir)?;
    let busy = scenarios::busy_cpu_secs()?;
    // Every 10 ms: the writer's burst allowance (16 MiB, before the daemon
    // hears of it) lasts tens of ms, and a 100 ms sampler caught it in some
    // runs only (peaks of 5-20 MiB for the same work).  What pacing holds
    // shows after it.
    let sampler = Sampler::every(&ctx.fs.bdi()?, Duration::from_millis(10))?;
    let (secs, cpu) = timed(Command::new("tar").arg("-xf").arg(&ctx.tarball).arg("-C").arg(&dir))?;
    let series = sampler.series();
    let sync = scenarios::timed_sync()?;
    let mib = |s: &[Sample]| (peak(s).dirty / MIB) as f64;
    let held: Vec<Sample> = series.iter().filter(|s| s.t >= 0.5).copied().collect();
    let mut m = vec![
        ("tar s", secs),
        ("sync s", sync),
        ("peak dirty MiB", mib(&series)),
        ("after 0.5 s MiB", mib(&held)),
        ("tar CPU s", cpu),
    ];
    let u = agent_metrics(agent, &mut m)?;
    m.push(("all CPUs s", scenarios::busy_cpu_secs()? - busy));
    if let Some(u) = u {
        m.push(("agent/tar CPU %", u.cpu / cpu * 100.0));
    }
    ctx.clean("cost-tar")?;
    Ok(m)
}

/// Closes faster than the agent handles them: the bench's writer makes
/// small files in a tight loop.  The agent's rate is read from its own
/// counters, snapshot to snapshot, while it works.
fn flood(ctx: &Ctx, s: &CostSizes, agent: Option<&Agent>) -> Result<Metrics> {
    let dir = ctx.clean("cost-flood")?;
    std::fs::create_dir_all(&dir)?;
    let stop = AtomicBool::new(false);
    let (m, snaps) = std::thread::scope(|sc| {
        let poller = agent.map(|a| sc.spawn(|| poll(&a.socket, &stop)));
        let m = flood_files(ctx, &dir, s.flood_files, agent);
        stop.store(true, Ordering::Relaxed);
        (m, poller.map(|p| p.join().expect("status poller")).unwrap_or_default())
    });
    let mut m = m?;
    if agent.is_some() {
        m.push(("peak events/s", peak_rate(&snaps)));
    }
    ctx.clean("cost-flood")?;
    Ok(m)
}

/// `n` files from FLOOD_WRITERS processes at once, each in a directory of
/// its own.
fn flood_files(ctx: &Ctx, dir: &Path, n: u32, agent: Option<&Agent>) -> Result<Metrics> {
    let mut writers = Vec::new();
    for w in 0..FLOOD_WRITERS {
        let own = dir.join(format!("w{w}"));
        std::fs::create_dir_all(&own)?;
        let mut writer = Command::new(&ctx.xtask);
        writer.args(["writer", "plain", "files"]).arg(own).args([(n / FLOOD_WRITERS).to_string(), "1024".into()]);
        writers.push(writer);
    }
    let (secs, cpu) = timed_all(&mut writers.iter_mut().collect::<Vec<_>>())?;
    scenarios::timed_sync()?;
    let mut m = vec![("files/s", n as f64 / secs), ("writer CPU s", cpu)];
    if let Some(u) = agent_metrics(agent, &mut m)? {
        m.push(("events per agent CPU s", u.events as f64 / u.cpu));
    }
    Ok(m)
}

/// Status snapshots every 250 ms until `stop` (a new one each second).
fn poll(socket: &Path, stop: &AtomicBool) -> Vec<Snapshot> {
    let mut snaps: Vec<Snapshot> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        if let Ok(s) = status(socket)
            && snaps.last().is_none_or(|l| s.uptime > l.uptime)
        {
            snaps.push(s);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    snaps
}

/// The highest events/s between consecutive snapshots.
fn peak_rate(snaps: &[Snapshot]) -> f64 {
    snaps
        .windows(2)
        .map(|w| (w[1].get("events") - w[0].get("events")) as f64 / (w[1].uptime - w[0].uptime))
        .fold(0.0, f64::max)
}
