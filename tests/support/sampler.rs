//! Samples one device's dirty and writeback pages every 100 ms.
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
    time::Duration,
};

use anyhow::{Context, Result};

use super::device::{DEBUGFS, Debugfs};

#[derive(Debug, Clone, Copy, Default)]
pub struct Peak {
    /// Highest dirty (BdiReclaimable) seen, bytes.
    pub dirty: u64,
    /// Highest dirty + writeback seen, bytes.
    pub dirty_wb: u64,
    pub samples: u64,
}

/// (dirty, writeback) of a bdi now, in bytes.
pub fn bdi_dirty_writeback(bdi: &str) -> Result<(u64, u64)> {
    let path = format!("{DEBUGFS}/bdi/{bdi}/stats");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    Ok((field("BdiReclaimable:"), field("BdiWriteback:")))
}

pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Peak>>,
    _debugfs: Debugfs,
}

impl Sampler {
    pub fn start(bdi: &str) -> Result<Self> {
        let debugfs = Debugfs::ensure()?;
        bdi_dirty_writeback(bdi)?; // fail now, not silently in the thread
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, bdi) = (stop.clone(), bdi.to_owned());
        let handle = thread::spawn(move || {
            let mut peak = Peak::default();
            while !flag.load(Ordering::Relaxed) {
                if let Ok((dirty, wb)) = bdi_dirty_writeback(&bdi) {
                    peak.dirty = peak.dirty.max(dirty);
                    peak.dirty_wb = peak.dirty_wb.max(dirty + wb);
                    peak.samples += 1;
                }
                thread::sleep(Duration::from_millis(100));
            }
            peak
        });
        Ok(Self { stop, handle: Some(handle), _debugfs: debugfs })
    }

    pub fn finish(mut self) -> Peak {
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
