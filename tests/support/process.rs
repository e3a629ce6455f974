//! Programs a test runs in the background, stopped with the test.

use std::{
    os::unix::process::CommandExt,
    process::{Child, Command, ExitStatus, Stdio},
};

use anyhow::{Context, Result, bail};

/// A command (often a shell pipeline) in a process group of its own, so that
/// dropping it kills the whole pipeline, also when the test fails.
pub struct Background(pub Child);

impl Background {
    pub fn spawn(cmd: &mut Command) -> Result<Self> {
        Ok(Self(cmd.stdin(Stdio::null()).process_group(0).spawn()?))
    }

    /// `sh -c script`.
    pub fn sh(script: &str) -> Result<Self> {
        Self::spawn(Command::new("sh").arg("-c").arg(script))
    }

    pub fn wait(&mut self) -> Result<ExitStatus> {
        Ok(self.0.wait()?)
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Sends `sig` to the whole pipeline (SIGSTOP pauses a writer, SIGCONT
    /// resumes it).
    pub fn signal(&self, sig: i32) {
        unsafe { libc::kill(-(self.0.id() as i32), sig) };
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
            let _ = self.0.wait();
        }
    }
}

/// fio writing `mib` MiB sequentially to `file` in 1 MiB writes and
/// fsyncing it at the end: (MiB/s by the wall clock, the fsync included;
/// the longest write() in ms).
pub fn fio_write_fsync(file: &std::path::Path, mib: u64) -> Result<(f64, f64)> {
    let t = std::time::Instant::now();
    let out = super::run(Command::new("fio").args([
        "--name=writer",
        &format!("--filename={}", file.display()),
        "--rw=write",
        "--bs=1M",
        &format!("--size={mib}M"),
        "--ioengine=psync",
        "--end_fsync=1",
        "--output-format=json",
    ]))?;
    let mibs = mib as f64 / t.elapsed().as_secs_f64();
    let v: serde_json::Value = serde_json::from_str(&out).context("fio's json")?;
    let longest = v["jobs"][0]["write"]["clat_ns"]["max"].as_f64().unwrap_or(f64::NAN) / 1e6;
    Ok((mibs, longest))
}

/// CPU seconds process `pid` has used so far, all its threads (utime +
/// stime: /proc/<pid>/stat fields 14 and 15, in clock ticks).
pub fn cpu_secs(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces: count fields after its ')'.
    let after = stat.rsplit_once(')').map(|(_, a)| a).unwrap_or_default();
    let f: Vec<u64> = after.split_whitespace().skip(11).take(2).filter_map(|x| x.parse().ok()).collect();
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    match f[..] {
        [utime, stime] => Ok((utime + stime) as f64 / tick),
        _ => bail!("cannot read the CPU time of {pid}: {stat}"),
    }
}
