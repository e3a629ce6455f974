//! Latency probes run on the device during a workload: what an unrelated
//! process feels while a big writer streams.
//!   fsync: append 4 KiB + fdatasync every 50 ms (a log, a database commit)
//!   read:  O_DIRECT random 4 KiB reads of a pre-written file, every 10 ms

use std::{
    alloc::{Layout, alloc_zeroed, dealloc},
    fs::OpenOptions,
    io::Write,
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::Result;

/// A probe thread, returning its latencies in seconds.
type Latencies = JoinHandle<Vec<f64>>;

pub struct Probes {
    stop: Arc<AtomicBool>,
    threads: Option<(Latencies, Latencies)>,
}

/// Latencies in seconds, as (p50, p99, max).
pub fn percentiles(mut v: Vec<f64>) -> (f64, f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), v[v.len() - 1])
}

/// The file the read probe reads; written once per device.
pub fn prepare_read_file(path: &Path, mib: u64) -> Result<()> {
    let mut f = std::fs::File::create(path)?;
    let block = vec![0x5au8; 1 << 20];
    for _ in 0..mib {
        f.write_all(&block)?;
    }
    f.sync_all()?;
    Ok(())
}

impl Probes {
    pub fn start(fsync_path: PathBuf, read_path: PathBuf) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut log = OpenOptions::new().create(true).append(true).open(&fsync_path)?;
        let s = stop.clone();
        let fsync = thread::spawn(move || {
            let (block, mut lat) = ([0x42u8; 4096], Vec::new());
            while !s.load(Ordering::Relaxed) {
                let t = Instant::now();
                if log.write_all(&block).is_ok() && log.sync_data().is_ok() {
                    lat.push(t.elapsed().as_secs_f64());
                }
                thread::sleep(Duration::from_millis(50).saturating_sub(t.elapsed()));
            }
            lat
        });
        let file = OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&read_path)?;
        let blocks = file.metadata()?.len() / 4096;
        let s = stop.clone();
        let read = thread::spawn(move || {
            let layout = Layout::from_size_align(4096, 4096).unwrap();
            let buf = unsafe { alloc_zeroed(layout) };
            let (mut x, mut lat) = (0x9e37_79b9_7f4a_7c15u64, Vec::new());
            while !s.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let off = (x % blocks.max(1)) * 4096;
                let t = Instant::now();
                let n = unsafe { libc::pread(file.as_raw_fd(), buf.cast(), 4096, off as i64) };
                if n == 4096 {
                    lat.push(t.elapsed().as_secs_f64());
                }
                thread::sleep(Duration::from_millis(10));
            }
            unsafe { dealloc(buf, layout) };
            lat
        });
        Ok(Self { stop, threads: Some((fsync, read)) })
    }

    /// (fsync latencies, read latencies), seconds.
    pub fn stop(mut self) -> (Vec<f64>, Vec<f64>) {
        self.join()
    }

    fn join(&mut self) -> (Vec<f64>, Vec<f64>) {
        self.stop.store(true, Ordering::Relaxed);
        match self.threads.take() {
            Some((f, r)) => (f.join().unwrap_or_default(), r.join().unwrap_or_default()),
            None => (Vec::new(), Vec::new()),
        }
    }
}

/// A run that fails early still stops its probes: their open files would
/// keep the filesystem busy.
impl Drop for Probes {
    fn drop(&mut self) {
        self.join();
    }
}
