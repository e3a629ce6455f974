//! The `db` scenario: a real database on the capped device while the copy
//! streams to it.  PostgreSQL (Debian's package) runs pgbench's TPC-B-like
//! load (`-i -s 10`, 4 clients, 2 threads) from before the copy starts until
//! its `cp` and `sync` end: what a database's commits feel, and whether the
//! database costs the copy.  In writebehindd modes the run is made again with
//! the database's cgroup under a `mode = "off"` policy, as policies/examples/
//! advise for a database that manages its own writeback: the daemon leaves
//! PostgreSQL's writes alone and still paces the device.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};
use wb_tests::{Cgroup, MIB, Sampler, Scratch, run, sh, wait_until};

use super::{
    modes::{self, Mode},
    probes,
    report::{self, Run},
    scenarios::{self, Ctx, Metrics},
};

/// pgbench's scale (the issue's): 1,000,000 accounts, about 160 MB of tables.
const SCALE: &str = "10";

/// Every run of the scenario, each mode in turn (and its `mode = "off"`
/// variant after each writebehindd mode); prints the table.
pub fn bench(ctx: &Ctx, modes: &[Mode], runs: u32, daemon: &Path, tag: &str, out: &mut Vec<Run>) -> Result<()> {
    let bin = postgres_bin()?;
    let group = format!("db + copy {:.1} GiB {tag}", ctx.copy_bytes as f64 / (1u64 << 30) as f64);
    for _ in 0..runs {
        for &mode in modes {
            let offs: &[bool] = if matches!(mode, Mode::Writebehindd(_)) { &[false, true] } else { &[false] };
            for &off in offs {
                let metrics = one(ctx, &bin, mode, daemon, off)?;
                let name = if off { format!("{} (db mode=off)", mode.name()) } else { mode.name() };
                out.push(Run::new(&group, &name, &metrics, &[]));
            }
        }
    }
    print!("{}", report::table(out, &group));
    Ok(())
}

/// The newest PostgreSQL Debian installed (15 on Debian 12, 17 on 13):
/// /usr/lib/postgresql/<version>/bin.
fn postgres_bin() -> Result<PathBuf> {
    let versions = std::fs::read_dir("/usr/lib/postgresql").ok().into_iter().flatten().flatten();
    versions
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("pgbench").exists() && bin.join("postgres").exists())
        .max_by_key(|(v, _)| *v)
        .map(|(_, bin)| bin)
        .context("no PostgreSQL with pgbench in /usr/lib/postgresql/*/bin: .ci/deps installs it (postgresql)")
}

/// One run: a fresh cluster, pgbench during the copy, the cluster stopped.
fn one(ctx: &Ctx, bin: &Path, mode: Mode, daemon: &Path, off: bool) -> Result<Metrics> {
    // Made before the daemon starts, so that its first walk of the cgroups
    // gives it the policy.
    let cgroup = match off {
        true => Some(Cgroup::at(&format!("/wb-bench-db-{}", std::process::id()))?),
        false => None,
    };
    let policy = cgroup.as_ref().map(|cg| format!("[[policy]]\ncgroup = \"{}\"\nmode = \"off\"\n", cg.path));
    let active = modes::activate_with(mode, &ctx.fs.bdi()?, ctx.rate, daemon, policy.as_deref(), &[])?;
    if let (Some(cg), Some(d)) = (&cgroup, active.daemon()) {
        let applied = format!("cgroup={} ", cg.path);
        wait_until("the daemon applying the database's policy", Duration::from_secs(10), || {
            Ok(d.log_text().lines().any(|l| l.contains("policy applied") && l.contains(&applied)))
        })?;
    }
    let cluster = Cluster::start(bin, &ctx.clean("db")?, cgroup.as_ref())?;
    cluster.init()?;
    let metrics = during_copy(ctx, mode, &cluster)?;
    drop(cluster);
    active.stop()?;
    ctx.clean("db")?;
    Ok(metrics)
}

/// pgbench from before the copy until its `sync` returns; figures from the
/// transactions that overlapped the copy.
fn during_copy(ctx: &Ctx, mode: Mode, cluster: &Cluster) -> Result<Metrics> {
    let logs = cluster.sock.0.join("tx");
    // pgbench ends a -T run on SIGALRM, its own duration timer, as when
    // the time is up: each client finishes its transaction, the
    // per-transaction logs are flushed and closed.  So -T is only an upper
    // bound and the copy says when to stop; SIGINT would kill it with the
    // logs' tail in stdio buffers, and a -T guessed from the copy's ideal
    // time would end early or late depending on the mode.
    let mut cmd = cluster.client("pgbench");
    cmd.args(["-n", "-c", "4", "-j", "2", "-T", "3600", "-l", "--log-prefix"]).arg(&logs);
    let mut pgbench = Pgbench(Some(cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?));
    // Transactions are running once a log has its first buffer written.
    wait_until("pgbench's first transactions", Duration::from_secs(20), || {
        Ok(log_files(&cluster.sock.0)?.iter().any(|f| f.metadata().is_ok_and(|m| m.len() > 0)))
    })?;

    let cmd = ctx.copy_command(mode)?;
    let sampler = Sampler::start(&ctx.fs.bdi()?)?;
    let (t0, t) = (epoch_secs(), Instant::now());
    scenarios::wait(scenarios::spawn(cmd)?, "copy")?;
    let copy_s = t.elapsed().as_secs_f64();
    let sync_s = scenarios::timed_sync()?;
    let t1 = epoch_secs();
    let peak = sampler.finish();
    pgbench.stop()?;
    ctx.clean("copy")?;

    let tx = transactions(&cluster.sock.0)?;
    // TPS over the copy; latencies of every transaction that overlapped it
    // (one that waited across its end is its worst).
    let done = tx.iter().filter(|(end, _)| (t0..=t1).contains(end)).count();
    let overlapping = tx.iter().filter(|(end, lat)| *end >= t0 && end - lat <= t1).map(|(_, lat)| *lat).collect();
    let (p50, p99, max) = probes::percentiles(overlapping);
    let ideal = ctx.copy_bytes as f64 / ctx.rate as f64;
    Ok(vec![
        ("tps", done as f64 / (t1 - t0)),
        ("tx p50 ms", p50 * 1e3),
        ("tx p99 ms", p99 * 1e3),
        ("tx max ms", max * 1e3),
        ("copy s", copy_s),
        ("sync s", sync_s),
        ("total s", copy_s + sync_s),
        ("total/ideal", (copy_s + sync_s) / ideal),
        ("peak MiB", peak.dirty_wb as f64 / MIB as f64),
    ])
}

fn epoch_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// pgbench's per-transaction logs (tx.<pid>, tx.<pid>.<thread>).
fn log_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_name().to_string_lossy().starts_with("tx.") {
            files.push(e.path());
        }
    }
    Ok(files)
}

/// (end, latency) of each logged transaction, seconds (end since the epoch).
/// A line is "client tx latency_us script end_s end_us".
fn transactions(dir: &Path) -> Result<Vec<(f64, f64)>> {
    let mut tx = Vec::new();
    for f in log_files(dir)? {
        for line in std::fs::read_to_string(&f)?.lines() {
            let v: Vec<&str> = line.split_whitespace().collect();
            let num = |i: usize| v.get(i).and_then(|s| s.parse::<f64>().ok());
            match (num(2), num(4), num(5)) {
                (Some(lat), Some(s), Some(us)) => tx.push((s + us / 1e6, lat / 1e6)),
                _ => bail!("{}: a line pgbench did not complete: {line:?}", f.display()),
            }
        }
    }
    Ok(tx)
}

/// The running pgbench; killed if the run fails before it is stopped.
struct Pgbench(Option<Child>);

impl Pgbench {
    fn stop(&mut self) -> Result<()> {
        let child = self.0.take().context("pgbench stopped twice")?;
        unsafe { libc::kill(child.id() as i32, libc::SIGALRM) };
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("pgbench failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    }
}

impl Drop for Pgbench {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A PostgreSQL cluster in `data` on the bench filesystem, run as user
/// postgres; its socket, lock file, server log and pgbench's logs in a
/// directory of its own under /tmp.  Stopped on drop, also when a run fails:
/// a server left running would keep the filesystem busy.
struct Cluster {
    bin: PathBuf,
    data: PathBuf,
    sock: Scratch,
    port: String,
}

impl Cluster {
    fn start(bin: &Path, data: &Path, cgroup: Option<&Cgroup>) -> Result<Self> {
        let sock = Scratch::new_in("/tmp", "pg")?;
        std::fs::create_dir(data)?;
        for dir in [data, &sock.0] {
            sh(&format!("chown postgres:postgres {0} && chmod 700 {0}", dir.display()))?;
        }
        // Unique beside the socket directory, for the logs' sake.
        let port = (40000 + std::process::id() % 20000).to_string();
        let c = Self { bin: bin.to_owned(), data: data.to_owned(), sock, port };
        run(c
            .as_postgres("initdb")
            .args(["-A", "trust", "-U", "postgres", "--locale=C", "-E", "UTF8", "--no-instructions", "-D"])
            .arg(data))?;
        // fsync and shared_buffers stay at their defaults; no TCP.
        let conf =
            format!("port = {}\nlisten_addresses = ''\nunix_socket_directories = '{}'\n", c.port, c.sock.0.display());
        std::fs::OpenOptions::new().append(true).open(data.join("postgresql.conf"))?.write_all(conf.as_bytes())?;
        let mut start = c.as_postgres("pg_ctl");
        start.args(["-w", "-l"]).arg(c.sock.0.join("server.log")).arg("-D").arg(data).arg("start");
        // The server inherits the cgroup pg_ctl starts in.
        let mut start = match cgroup {
            Some(cg) => {
                let mut wrap = Command::new("sh");
                let procs = cg.dir.join("cgroup.procs");
                wrap.args(["-c", &format!("echo $$ > {} && exec \"$@\"", procs.display()), "sh"])
                    .arg(start.get_program())
                    .args(start.get_args());
                wrap.current_dir(&c.sock.0);
                wrap
            }
            None => start,
        };
        run(&mut start).with_context(|| format!("server log: {}", c.server_log()))?;
        Ok(c)
    }

    /// pgbench -i, then a checkpoint and a sync: the measured run starts
    /// with no initialisation left to write.
    fn init(&self) -> Result<()> {
        run(self.client("pgbench").args(["-i", "-q", "-s", SCALE]))?;
        run(self.client("psql").args(["-q", "-c", "CHECKPOINT"]))?;
        sh("sync")?;
        Ok(())
    }

    /// A program of the server's, run as postgres in the socket directory.
    fn as_postgres(&self, program: &str) -> Command {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--"]).arg(self.bin.join(program));
        c.current_dir(&self.sock.0);
        c
    }

    /// A client connected through the socket (as root: trust authentication).
    fn client(&self, program: &str) -> Command {
        let mut c = Command::new(self.bin.join(program));
        // libpq's variables: pgbench's -d is --debug, psql's the database.
        c.env("PGHOST", &self.sock.0).env("PGPORT", &self.port).env("PGUSER", "postgres").env("PGDATABASE", "postgres");
        c.current_dir(&self.sock.0);
        c
    }

    fn server_log(&self) -> String {
        std::fs::read_to_string(self.sock.0.join("server.log")).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .as_postgres("pg_ctl")
            .args(["stop", "-m", "fast", "-D"])
            .arg(&self.data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transactions_are_read_from_every_thread_log() {
        let dir = Scratch::new_in("/tmp", "db-test").unwrap();
        std::fs::write(dir.0.join("tx.42"), "0 1 3083 0 1795672951 932061\n1 1 17581 0 1795672952 500000\n").unwrap();
        std::fs::write(dir.0.join("tx.42.1"), "2 1 5470 0 1795672951 934430\n").unwrap();
        std::fs::write(dir.0.join("server.log"), "not a transaction\n").unwrap();
        let mut tx = transactions(&dir.0).unwrap();
        tx.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert_eq!(tx.len(), 3);
        assert!((tx[2].0 - 1795672952.5).abs() < 1e-6 && (tx[2].1 - 0.017581).abs() < 1e-9, "{tx:?}");
        std::fs::write(dir.0.join("tx.42.1"), "2 1 54").unwrap();
        assert!(transactions(&dir.0).is_err(), "a truncated line is an error, not a dropped transaction");
    }
}
