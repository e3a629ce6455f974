//! System settings changed for a test or a bench run, and put back.
//!
//! A `Knob` writes a sysfs/procfs file and restores it on drop.  Because a
//! killed process runs no destructors, every change is also journaled in
//! /run/wb-testbed/knobs before it is made; `Knob::recover()` (called first
//! by every test and bench run) restores whatever a dead run left behind.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::Mounted;

const JOURNAL_DIR: &str = "/run/wb-testbed";
const JOURNAL: &str = "/run/wb-testbed/knobs";

static JOURNAL_LOCK: Mutex<()> = Mutex::new(());

pub struct Knob {
    restore_path: PathBuf,
    restore_value: String,
}

impl Knob {
    /// Writes `value` to `path`; drop writes the old value back.
    pub fn set(path: &str, value: &str) -> Result<Self> {
        let old = read(path)?;
        Self::set_restoring(path, value, path, &old)
    }

    /// Writes `value` to `path`; drop writes `restore_value` to
    /// `restore_path` (for settings whose undo is another file, like
    /// vm.dirty_bytes, which zeroes vm.dirty_ratio when set).
    pub fn set_restoring(path: &str, value: &str, restore_path: &str, restore_value: &str) -> Result<Self> {
        journal_add(restore_path, restore_value)?;
        let knob = Self { restore_path: restore_path.into(), restore_value: restore_value.into() };
        fs::write(path, value).with_context(|| format!("writing {value:?} to {path}"))?;
        Ok(knob)
    }

    /// Restores what a killed run left changed.
    pub fn recover() -> Result<()> {
        let _g = JOURNAL_LOCK.lock().unwrap();
        let Ok(text) = fs::read_to_string(JOURNAL) else {
            return Ok(());
        };
        // Newest first: later changes may depend on earlier ones.
        for line in text.lines().rev() {
            if let Some((path, value)) = line.split_once('\t') {
                eprintln!("testbed: restoring {path} to {value:?} (left by an interrupted run)");
                let _ = fs::write(path, value);
            }
        }
        fs::remove_file(JOURNAL)?;
        Ok(())
    }
}

impl Drop for Knob {
    fn drop(&mut self) {
        if let Err(e) = fs::write(&self.restore_path, &self.restore_value) {
            eprintln!("testbed: could not restore {}: {e}", self.restore_path.display());
            return;
        }
        journal_remove(&self.restore_path, &self.restore_value);
    }
}

/// The pacing knobs of a filesystem's bdi, as the daemon sets them.
pub struct BdiKnobs {
    pub dir: String,
}

impl BdiKnobs {
    pub fn of(fs: &Mounted) -> Result<Self> {
        Ok(Self { dir: format!("/sys/class/bdi/{}", fs.bdi()?) })
    }

    pub fn get(&self, name: &str) -> String {
        read(&format!("{}/{name}", self.dir)).unwrap()
    }

    /// (max_ratio_fine, strict_limit)
    pub fn values(&self) -> (String, String) {
        (self.get("max_ratio_fine"), self.get("strict_limit"))
    }

    /// Waits up to 10 s for strict_limit to read `strict`.
    pub fn wait_for(&self, strict: &str, what: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.get("strict_limit") != strict {
            if Instant::now() > deadline {
                bail!("{what}: strict_limit still {} after 10 s", self.get("strict_limit"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

pub fn read(path: &str) -> Result<String> {
    Ok(fs::read_to_string(path).with_context(|| format!("reading {path}"))?.trim().to_owned())
}

fn journal_add(path: &str, value: &str) -> Result<()> {
    let _g = JOURNAL_LOCK.lock().unwrap();
    fs::create_dir_all(JOURNAL_DIR)?;
    let mut f = fs::OpenOptions::new().create(true).append(true).open(JOURNAL)?;
    writeln!(f, "{path}\t{value}")?;
    f.sync_all()?;
    Ok(())
}

fn journal_remove(path: &Path, value: &str) {
    let _g = JOURNAL_LOCK.lock().unwrap();
    let Ok(text) = fs::read_to_string(JOURNAL) else {
        return;
    };
    let entry = format!("{}\t{value}", path.display());
    let mut lines: Vec<&str> = text.lines().collect();
    if let Some(i) = lines.iter().rposition(|l| *l == entry) {
        lines.remove(i);
    }
    let _ = if lines.is_empty() { fs::remove_file(JOURNAL) } else { fs::write(JOURNAL, lines.join("\n") + "\n") };
}

/// The kernel's global dirty limits: in each pair, the one not 0 is in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmLimits {
    pub dirty_bytes: String,
    pub dirty_ratio: String,
    pub background_bytes: String,
    pub background_ratio: String,
}

impl VmLimits {
    pub fn now() -> Result<Self> {
        let r = |n: &str| read(&format!("/proc/sys/vm/{n}"));
        Ok(Self {
            dirty_bytes: r("dirty_bytes")?,
            dirty_ratio: r("dirty_ratio")?,
            background_bytes: r("dirty_background_bytes")?,
            background_ratio: r("dirty_background_ratio")?,
        })
    }

    /// Sets these limits (the in-force one of each pair, the background
    /// first); the guards put back the ones before, whatever happens.
    pub fn set(&self) -> Result<[Knob; 2]> {
        let was = Self::now()?;
        let (bg, bg_was) = (self.background(), was.background());
        let (d, d_was) = (self.dirty(), was.dirty());
        Ok([
            Knob::set_restoring(&bg.0, &bg.1, &bg_was.0, &bg_was.1)?,
            Knob::set_restoring(&d.0, &d.1, &d_was.0, &d_was.1)?,
        ])
    }

    fn dirty(&self) -> (String, String) {
        pick("dirty", &self.dirty_bytes, &self.dirty_ratio)
    }

    fn background(&self) -> (String, String) {
        pick("dirty_background", &self.background_bytes, &self.background_ratio)
    }
}

fn pick(name: &str, bytes: &str, ratio: &str) -> (String, String) {
    if bytes != "0" {
        (format!("/proc/sys/vm/{name}_bytes"), bytes.into())
    } else {
        (format!("/proc/sys/vm/{name}_ratio"), ratio.into())
    }
}
