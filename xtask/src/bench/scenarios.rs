//! The workloads that judge write-behind.  Each run starts from an empty
//! target, measures, syncs and cleans up, so runs do not disturb each other.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use wb_tests::{MIB, Mounted, Sample, Sampler, sh};

use super::{
    modes::Mode,
    probes::{self, Probes},
    writer::Flavor,
};

/// What one run measured, in display order.
pub type Metrics = Vec<(&'static str, f64)>;

/// Sizes of one bench invocation (quick, smoke or full).
#[derive(Debug, Clone)]
pub struct Sizes {
    pub copy_files: u32,
    pub copy_max_mib: u64,
    pub tar_files: u32,
    pub tar_dd_mib: u64,
    pub multi_writers: Vec<u32>,
    pub multi_mib: u64,
    /// The `many` scenario's runs: (writers, MiB each), within and beyond
    /// the 16 MiB burst allowance.
    pub many: Vec<(u32, u64)>,
    pub overwrite_mib: u64,
    pub temp_files: u32,
    pub temp_mib: u64,
    pub read_probe_mib: u64,
    pub overhead_secs: f64,
}

/// Everything a scenario needs: the device, its rate, the programs, sources.
pub struct Ctx<'a> {
    pub fs: &'a Mounted,
    /// Bytes per second the device is capped at; 0 on the raw device.
    pub rate: u64,
    pub sizes: &'a Sizes,
    pub xtask: PathBuf,
    pub copy_src: PathBuf,
    pub copy_bytes: u64,
    pub tarball: PathBuf,
}

impl Ctx<'_> {
    fn bdi(&self) -> String {
        self.fs.bdi().expect("bdi of the bench filesystem")
    }

    /// The bench's own writer for in-application modes, else the real program.
    fn writer(&self, mode: Mode, args: &[&str], real: Command) -> Command {
        match mode.flavor() {
            Some(f) => {
                let mut c = Command::new(&self.xtask);
                c.arg("writer").arg(f.key()).args(args);
                c
            }
            None => real,
        }
    }

    /// The big copy into a fresh `copy` on the device: `cp -r`, or the
    /// bench's own writer in in-application modes.
    pub(super) fn copy_command(&self, mode: Mode) -> Result<Command> {
        let dst = self.clean("copy")?;
        let (src, dst) = (self.copy_src.display().to_string(), dst.display().to_string());
        let mut cp = Command::new("cp");
        cp.args(["-r", &src, &dst]);
        Ok(self.writer(mode, &["copy-tree", &src, &dst], cp))
    }

    pub fn clean(&self, name: &str) -> Result<PathBuf> {
        let p = self.fs.path(name);
        sh(&format!("rm -rf {0} && sync", p.display()))?;
        Ok(p)
    }
}

/// dd if=/dev/zero of=path bs=1M count=mib
fn dd(path: &str, mib: &str) -> Command {
    let mut c = Command::new("dd");
    c.args(["if=/dev/zero", &format!("of={path}"), "bs=1M", &format!("count={mib}")]).stderr(Stdio::null());
    c
}

pub(super) fn spawn(mut cmd: Command) -> Result<Child> {
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).spawn().with_context(|| format!("spawning {cmd:?}"))
}

pub(super) fn wait(mut child: Child, what: &str) -> Result<()> {
    let st = child.wait()?;
    if !st.success() {
        bail!("{what} failed: {st}");
    }
    Ok(())
}

/// Waits for a child and fails if it failed; its CPU seconds (user +
/// system, with the children it waited for), from wait4's rusage.
pub(super) fn wait_cpu(child: Child, what: &str) -> Result<f64> {
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it for our own child, which
    // nothing else waits for.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) } < 0 {
        bail!("wait4 for {what}: {}", std::io::Error::last_os_error());
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("{what} failed (wait status {status:#x})");
    }
    let secs = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    Ok(secs(ru.ru_utime) + secs(ru.ru_stime))
}

/// CPU time spent by everything on the machine so far (/proc/stat: all but
/// idle and iowait), seconds.  The agent's own CPU includes writeback that
/// the kernel's flusher threads do without it (a profile of the agent under
/// tar x: a third of its time in ext4_writepages, allocating blocks and
/// submitting bios); the whole machine's CPU for the same work and sync
/// counts both.
pub(super) fn busy_cpu_secs() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let cpu = stat.lines().next().context("/proc/stat is empty")?;
    let ticks: Vec<f64> = cpu.split_whitespace().skip(1).map(|t| t.parse().unwrap_or(0.0)).collect();
    // user nice system idle iowait irq softirq steal (guest time is in user).
    let busy: f64 = ticks.iter().take(8).sum::<f64>() - ticks.get(3).unwrap_or(&0.0) - ticks.get(4).unwrap_or(&0.0);
    // SAFETY: sysconf has no preconditions.
    Ok(busy / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}

/// (thread name, CPU seconds).
type Threads = Vec<(String, f64)>;

/// Each thread of a process: (name, CPU seconds so far, user + system),
/// from /proc/<pid>/task/*/stat.  Threads of one name are summed.
fn thread_cpu(pid: u32) -> Result<Threads> {
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let mut out: Threads = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        // A thread may end between the listing and the read.
        let Ok(stat) = std::fs::read_to_string(task?.path().join("stat")) else { continue };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let name = stat[open + 1..close].to_string();
        let f: Vec<u64> =
            stat[close + 1..].split_whitespace().skip(11).take(2).filter_map(|x| x.parse().ok()).collect();
        let secs = f.iter().sum::<u64>() as f64 / tick;
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some(t) => t.1 += secs,
            None => out.push((name, secs)),
        }
    }
    Ok(out)
}

/// The CPU a run costs, from its start to `sync` done: the agent's own
/// (/proc/<pid>/stat, every thread), the whole machine's (/proc/stat, the
/// kernel's flusher threads included) and the writers' (their rusage).
pub(super) struct CpuMeter {
    /// The agent's pid, its CPU seconds and its threads' at the start.
    agent: Option<(u32, f64, Threads)>,
    busy: f64,
    written: u64,
}

impl CpuMeter {
    pub fn start(ctx: &Ctx, agent: Option<u32>) -> Result<Self> {
        let agent = match agent {
            Some(pid) => Some((pid, wb_tests::cpu_secs(pid)?, thread_cpu(pid)?)),
            None => None,
        };
        Ok(Self { agent, busy: busy_cpu_secs()?, written: ctx.fs.device.bytes_written()? })
    }

    /// Appends the run's CPU figures to `m`; on the raw device also the
    /// agent's CPU per thread ("agent <thread name> s"), where a device
    /// that drains at GB/s makes the agent's own work show.
    pub fn finish(self, ctx: &Ctx, writers_cpu: f64, m: &mut Metrics) -> Result<()> {
        let busy = busy_cpu_secs()? - self.busy;
        let gib = (ctx.fs.device.bytes_written()? - self.written) as f64 / (1u64 << 30) as f64;
        m.push(("writers CPU s", writers_cpu));
        m.push(("system CPU s", busy));
        if let Some((pid, cpu0, threads0)) = self.agent {
            let cpu = wb_tests::cpu_secs(pid)? - cpu0;
            m.push(("agent CPU s", cpu));
            m.push(("agent CPU s/GiB", if gib > 0.0 { cpu / gib } else { f64::NAN }));
            if ctx.rate == 0 {
                for (name, secs) in thread_cpu(pid)? {
                    let before = threads0.iter().find(|(n, _)| *n == name).map_or(0.0, |t| t.1);
                    let key: &'static str = Box::leak(format!("agent {name} s").into_boxed_str());
                    m.push((key, secs - before));
                }
            }
        }
        Ok(())
    }
}

/// Sampling dirty pages: every 100 ms on a capped device; every 10 ms on the
/// raw one, where a 1 GiB copy is in the page cache within 0.7 s and written
/// back in as much again (a 100 ms sampler takes a handful of samples).
fn sampler(ctx: &Ctx) -> Result<Sampler> {
    match ctx.rate {
        0 => Sampler::every(&ctx.bdi(), std::time::Duration::from_millis(10)),
        _ => Sampler::start(&ctx.bdi()),
    }
}

pub fn timed_sync() -> Result<f64> {
    let t = Instant::now();
    sh("sync")?;
    Ok(t.elapsed().as_secs_f64())
}

/// `cp -r` of many files of random size, with latency probes on the device.
/// `agent`: the daemon's pid, for its CPU.
pub fn copy(ctx: &Ctx, mode: Mode, agent: Option<u32>) -> Result<(Metrics, Vec<Sample>)> {
    let cmd = ctx.copy_command(mode)?;
    let before = ctx.fs.device.bytes_written()?;
    let probes = Probes::start(ctx.fs.path("probe-fsync"), ctx.fs.path("probe-read"))?;
    let sampler = sampler(ctx)?;
    let cpu = CpuMeter::start(ctx, agent)?;
    let t = Instant::now();
    let writers_cpu = wait_cpu(spawn(cmd)?, "copy")?;
    let copy_s = t.elapsed().as_secs_f64();
    let sync_s = timed_sync()?;
    let series = sampler.series();
    let (fsync, read) = probes.stop();
    let written = ctx.fs.device.bytes_written()? - before;
    let peak = wb_tests::sampler::peak(&series);
    let (f50, f99, fmax) = probes::percentiles(fsync);
    let (r50, r99, rmax) = probes::percentiles(read);
    let mut m = vec![("copy s", copy_s), ("sync s", sync_s), ("total s", copy_s + sync_s)];
    // The ideal is every byte at the cap; the raw device has none.
    if ctx.rate > 0 {
        m.push(("total/ideal", (copy_s + sync_s) / (ctx.copy_bytes as f64 / ctx.rate as f64)));
    }
    m.extend([
        ("peak MiB", peak.dirty_wb as f64 / MIB as f64),
        ("mean MiB", peak.mean_dirty_wb as f64 / MIB as f64),
        ("written GiB", written as f64 / (1u64 << 30) as f64),
        ("fsync p50 ms", f50 * 1e3),
        ("fsync p99 ms", f99 * 1e3),
        ("fsync max ms", fmax * 1e3),
        ("read p50 ms", r50 * 1e3),
        ("read p99 ms", r99 * 1e3),
        ("read max ms", rmax * 1e3),
    ]);
    cpu.finish(ctx, writers_cpu, &mut m)?;
    ctx.clean("copy")?;
    Ok((m, series))
}

/// tar x of many small files while a 1 GiB dd streams to the same device.
pub fn tar(ctx: &Ctx, mode: Mode, agent: Option<u32>) -> Result<Metrics> {
    let dir = ctx.clean("tar")?;
    std::fs::create_dir_all(&dir)?;
    let dd_path = ctx.clean("dd")?.display().to_string();
    let mib = ctx.sizes.tar_dd_mib.to_string();
    let dd_cmd = ctx.writer(mode, &["zeros", &dd_path, &mib], dd(&dd_path, &mib));
    let mut tar_cmd = Command::new("tar");
    tar_cmd.arg("-xf").arg(&ctx.tarball).arg("-C").arg(&dir);
    let sampler = sampler(ctx)?;
    let cpu = CpuMeter::start(ctx, agent)?;
    let t = Instant::now();
    let (tar_child, dd_child) = (spawn(tar_cmd)?, spawn(dd_cmd)?);
    let tar_done = std::thread::spawn(move || -> Result<(f64, f64)> {
        let cpu = wait_cpu(tar_child, "tar")?;
        Ok((t.elapsed().as_secs_f64(), cpu))
    });
    let dd_cpu = wait_cpu(dd_child, "dd")?;
    let dd_s = t.elapsed().as_secs_f64();
    let (tar_s, tar_cpu) = tar_done.join().expect("tar thread")?;
    timed_sync()?;
    let total = t.elapsed().as_secs_f64();
    let peak = sampler.finish();
    let mut m = vec![
        ("tar s", tar_s),
        ("dd s", dd_s),
        ("writers s", tar_s.max(dd_s)),
        ("to sync done s", total),
        ("peak MiB", peak.dirty_wb as f64 / MIB as f64),
    ];
    cpu.finish(ctx, tar_cpu + dd_cpu, &mut m)?;
    ctx.clean("tar")?;
    ctx.clean("dd")?;
    Ok(m)
}

fn extents(path: &Path) -> Result<u64> {
    let out = sh(&format!("filefrag {}", path.display()))?;
    out.split(':')
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("parsing filefrag output {out:?}"))
}

/// n concurrent dd writers; throughput includes the final sync.
pub fn multi(ctx: &Ctx, mode: Mode, n: u32, agent: Option<u32>) -> Result<Metrics> {
    writers(ctx, mode, n, ctx.sizes.multi_mib, "multi", agent)
}

/// n dd writers at once, `mib` each (the `many` scenario: Wu's 100 dd,
/// Hansen's 30 cp, `make -j`): what their device holds, whoever writes;
/// with a daemon (its control socket), its slowest `status` answer while
/// they write, asked every 200 ms ("status ms").
pub fn many(ctx: &Ctx, mode: Mode, n: u32, mib: u64, agent: Option<(u32, &Path)>) -> Result<Metrics> {
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        let poller =
            agent.map(|(_, socket)| sc.spawn(|| slowest_status(socket, &stop, Duration::from_millis(200), |_| {})));
        let m = writers(ctx, mode, n, mib, "many", agent.map(|a| a.0));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut m = m?;
        if let Some(p) = poller {
            m.push(("status ms", p.join().expect("status poller")?));
        }
        Ok(m)
    })
}

/// The slowest of the daemon's `status` answers, asked every `every` until
/// `stop`, in ms; each answer's data is shown to `seen`.
pub(super) fn slowest_status(
    socket: &Path,
    stop: &std::sync::atomic::AtomicBool,
    every: Duration,
    mut seen: impl FnMut(&serde_json::Value),
) -> Result<f64> {
    let mut slowest: f64 = 0.0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let t = Instant::now();
        seen(&super::socket::status(socket)?);
        slowest = slowest.max(t.elapsed().as_secs_f64() * 1000.0);
        std::thread::sleep(every);
    }
    Ok(slowest)
}

/// n concurrent dd writers of `mib` each into `name`: throughput to `sync`
/// done, the `sync` after the writers, extents per file, peak dirty +
/// writeback, CPU.
fn writers(ctx: &Ctx, mode: Mode, n: u32, mib: u64, name: &str, agent: Option<u32>) -> Result<Metrics> {
    let dir = ctx.clean(name)?;
    std::fs::create_dir_all(&dir)?;
    let count = mib.to_string();
    let files: Vec<String> = (0..n).map(|i| dir.join(format!("w{i}")).display().to_string()).collect();
    let sampler = sampler(ctx)?;
    let cpu = CpuMeter::start(ctx, agent)?;
    let t = Instant::now();
    let children = files
        .iter()
        .map(|f| spawn(ctx.writer(mode, &["zeros", f, &count], dd(f, &count))))
        .collect::<Result<Vec<_>>>()?;
    let mut writers_cpu = 0.0;
    for c in children {
        writers_cpu += wait_cpu(c, "dd")?;
    }
    let writers_s = t.elapsed().as_secs_f64();
    let sync_s = timed_sync()?;
    let secs = t.elapsed().as_secs_f64();
    let peak = sampler.finish();
    let mut ext = 0;
    for f in &files {
        ext += extents(Path::new(f))?;
    }
    let total = n as f64 * mib as f64;
    let mut m = vec![
        ("MiB/s", total / secs),
        ("extents/file", ext as f64 / n as f64),
        ("writers s", writers_s),
        ("sync s", sync_s),
        ("s", secs),
        ("peak MiB", peak.dirty_wb as f64 / MIB as f64),
    ];
    cpu.finish(ctx, writers_cpu, &mut m)?;
    ctx.clean(name)?;
    Ok(m)
}

/// Zero-then-overwrite through one fd: bytes that reached the device.
pub fn overwrite(ctx: &Ctx, mode: Mode) -> Result<Metrics> {
    let f = ctx.clean("overwrite")?;
    let mib = ctx.sizes.overwrite_mib;
    let flavor = mode.flavor().unwrap_or(Flavor::Plain);
    let before = ctx.fs.device.bytes_written()?;
    let mut cmd = Command::new(&ctx.xtask);
    cmd.args(["writer", flavor.key(), "overwrite"]).arg(&f).arg(mib.to_string());
    wait(spawn(cmd)?, "overwrite")?;
    timed_sync()?;
    let written = ctx.fs.device.bytes_written()? - before;
    ctx.clean("overwrite")?;
    Ok(vec![("written MiB", written as f64 / MIB as f64), ("x file size", written as f64 / (mib * MIB) as f64)])
}

/// Temporary files written and deleted before any sync.
pub fn tempfile(ctx: &Ctx, mode: Mode) -> Result<Metrics> {
    let dir = ctx.clean("temp")?;
    std::fs::create_dir_all(&dir)?;
    let before = ctx.fs.device.bytes_written()?;
    let mib = ctx.sizes.temp_mib.to_string();
    for i in 0..ctx.sizes.temp_files {
        let f = dir.join(format!("t{i}")).display().to_string();
        wait(spawn(ctx.writer(mode, &["zeros", &f, &mib], dd(&f, &mib)))?, "dd")?;
        std::fs::remove_file(&f)?;
    }
    timed_sync()?;
    let written = ctx.fs.device.bytes_written()? - before;
    let total = ctx.sizes.temp_files as u64 * ctx.sizes.temp_mib;
    Ok(vec![("written MiB", written as f64 / MIB as f64), ("of MiB", total as f64)])
}

/// The hook's cost: 4 KiB write()s to tmpfs, where there is nothing to flush.
pub fn overhead(secs: f64) -> Result<Metrics> {
    overhead_in(Path::new("/dev/shm"), 4096, secs, false)
}

/// 4 KiB write()s into `dir`, `region` of them over and over the same
/// bytes (rewound), so that the page cache does not grow and, below the
/// smallest window (2 MiB), the daemon has nothing to flush.  `fresh`: the
/// file is emptied instead of rewound, so that every write dirties a page
/// of its own (what the dirtied-page hook sees; over the same bytes the
/// pages stay dirty and it never runs).
pub fn overhead_in(dir: &Path, region: u64, secs: f64, fresh: bool) -> Result<Metrics> {
    use std::io::{Seek, Write};
    let path = dir.join(format!("wb-overhead-{}", std::process::id()));
    let mut f = std::fs::File::create(&path)?;
    let block = [7u8; 4096];
    let (t, mut n) = (Instant::now(), 0u64);
    while t.elapsed().as_secs_f64() < secs {
        for _ in 0..region {
            f.write_all(&block)?;
        }
        n += region;
        if fresh {
            f.set_len(0)?;
        }
        f.rewind()?;
    }
    let secs = t.elapsed().as_secs_f64();
    drop(f);
    std::fs::remove_file(&path)?;
    Ok(vec![("writes/s", n as f64 / secs), ("ns/write", secs * 1e9 / n as f64)])
}

/// Reproducible sources in tmpfs under `root`: the copy tree and the
/// tarball, each made once per bench and shared by the devices and rates
/// that use the same sizes (the raw device uses the capped one's copy tree;
/// a second 3 GiB tree would take memory the page cache of the runs needs).
pub fn make_sources(root: &Path, sizes: &Sizes, compressible: bool) -> Result<(PathBuf, u64, PathBuf)> {
    let z = if compressible { "-z" } else { "" };
    let copy_src = root.join(format!("copy-{}-{}{z}", sizes.copy_files, sizes.copy_max_mib));
    let made = copy_src.with_extension("total");
    let total = match std::fs::read_to_string(&made).ok().and_then(|t| t.trim().parse().ok()) {
        Some(total) => total,
        None => {
            let _ = std::fs::remove_dir_all(&copy_src);
            let total = match compressible {
                false => wb_tests::random_tree(&copy_src, sizes.copy_files, 0, sizes.copy_max_mib * MIB, 0x2545)?,
                true => corpus_tree(&copy_src, sizes.copy_files, sizes.copy_max_mib * MIB)?,
            };
            std::fs::write(&made, total.to_string())?;
            total
        }
    };
    let tarball = root.join(format!("tar-{}.tar", sizes.tar_files));
    if !tarball.exists() {
        let tar_src = root.join("tar-src");
        wb_tests::random_tree(&tar_src, sizes.tar_files, 1024, 148 * 1024, 0x9e37)?;
        let tmp = tarball.with_extension("tmp");
        sh(&format!(
            "tar -cf {} -C {} . && rm -rf {} && mv {} {}",
            tmp.display(),
            tar_src.display(),
            tar_src.display(),
            tmp.display(),
            tarball.display()
        ))?;
    }
    Ok((copy_src, total, tarball))
}

/// `files` files of up to `max` bytes cut from a tar of /usr/lib and
/// /usr/share: what a filesystem that compresses meets (programs,
/// libraries, text, and some data already compressed; compress=zstd:1
/// wrote 0.9 GiB of it as 0.39 GiB here).  Contents from this machine's
/// /usr, in name order; sizes up to `max` from random_tree's generator
/// and seed, one draw per file (so not random_tree's sizes).  Returns the
/// total.
fn corpus_tree(dir: &Path, files: u32, max: u64) -> Result<u64> {
    use std::io::Read;
    let mut tar = Command::new("tar")
        .args(["--sort=name", "-cf", "-", "/usr/lib", "/usr/share"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("tar of /usr for the compressible copy source")?;
    let mut corpus = tar.stdout.take().context("tar's output")?;
    let mut rng = 0x2545u64 | 1;
    let mut total = 0;
    for i in 0..files {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let bytes = rng % (max + 1);
        let sub = dir.join(format!("d{:03}", i / 200));
        std::fs::create_dir_all(&sub)?;
        let mut f = std::fs::File::create(sub.join(format!("f{i:05}")))?;
        let got = std::io::copy(&mut (&mut corpus).take(bytes), &mut f)?;
        if got < bytes {
            bail!("/usr/lib and /usr/share hold less than the {} MiB the copy needs", (total + bytes) / MIB);
        }
        total += bytes;
    }
    drop(corpus);
    let _ = tar.kill();
    let _ = tar.wait();
    Ok(total)
}
