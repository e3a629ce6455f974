//! Samples one device's dirty and writeback pages every 100 ms (or as asked).
//!
//! debugfs bdi/<maj:min>/stats counts that device alone (BdiReclaimable is
//! its dirty, BdiWriteback its writeback); /proc/meminfo would count every
//! other writer on the machine too.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::device::{DEBUGFS, Debugfs};

#[derive(Debug, Clone, Copy, Default)]
pub struct Peak {
    /// Highest dirty (BdiReclaimable) seen, bytes.
    pub dirty: u64,
    /// Highest dirty + writeback seen, bytes.
    pub dirty_wb: u64,
    /// Mean of dirty + writeback over the samples, bytes.
    pub mean_dirty_wb: u64,
    pub samples: u64,
}

/// One sample: seconds since the sampler started, dirty and writeback bytes,
/// and the bytes the device's writeback completed so far (BdiWritten).
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub t: f64,
    pub dirty: u64,
    pub writeback: u64,
    pub written: u64,
}

pub fn peak(series: &[Sample]) -> Peak {
    let n = series.len() as u64;
    Peak {
        dirty: series.iter().map(|s| s.dirty).max().unwrap_or(0),
        dirty_wb: series.iter().map(|s| s.dirty + s.writeback).max().unwrap_or(0),
        mean_dirty_wb: series.iter().map(|s| s.dirty + s.writeback).sum::<u64>() / n.max(1),
        samples: n,
    }
}

/// (dirty, writeback) of a bdi now, in bytes.
pub fn bdi_dirty_writeback(bdi: &str) -> Result<(u64, u64)> {
    bdi_stats(bdi).map(|(dirty, writeback, _)| (dirty, writeback))
}

/// The device's dirty, writeback and written bytes (the last cumulative).
fn bdi_stats(bdi: &str) -> Result<(u64, u64, u64)> {
    let path = format!("{DEBUGFS}/bdi/{bdi}/stats");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    Ok((field("BdiReclaimable:"), field("BdiWriteback:"), field("BdiWritten:")))
}

pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Vec<Sample>>>,
    _debugfs: Debugfs,
}

impl Sampler {
    pub fn start(bdi: &str) -> Result<Self> {
        Self::every(bdi, Duration::from_millis(100))
    }

    /// Sampling every `interval` (a burst of a few tens of ms needs 10 ms).
    pub fn every(bdi: &str, interval: Duration) -> Result<Self> {
        let debugfs = Debugfs::ensure()?;
        bdi_dirty_writeback(bdi)?; // fail now, not silently in the thread
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, bdi) = (stop.clone(), bdi.to_owned());
        let handle = thread::spawn(move || {
            let (start, mut series) = (Instant::now(), Vec::new());
            while !flag.load(Ordering::Relaxed) {
                if let Ok((dirty, writeback, written)) = bdi_stats(&bdi) {
                    series.push(Sample { t: start.elapsed().as_secs_f64(), dirty, writeback, written });
                }
                thread::sleep(interval);
            }
            series
        });
        Ok(Self { stop, handle: Some(handle), _debugfs: debugfs })
    }

    pub fn finish(self) -> Peak {
        peak(&self.series())
    }

    pub fn series(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().unwrap().join().expect("sampler thread")
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
