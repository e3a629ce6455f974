//! The journal of the administrator's values, and the writes to the knobs.

use std::{fs, path::Path};

use anyhow::{Context, Result};

/// Written aside and renamed into place: a kill leaves the old journal or
/// the new one, never a part.  No fsync: /run is tmpfs, and a power loss
/// takes the knobs' values with it too.
pub(super) fn write_journal(journal: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let tmp = journal.with_extension("tmp");
    crate::sys::private_file(&tmp, fs::OpenOptions::new().write(true).create(true).truncate(true))
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, journal).with_context(|| format!("writing {}", journal.display()))
}

pub(super) fn write_knob(path: &Path, value: &str) -> Result<()> {
    crate::sys::write_setting(path, value).with_context(|| format!("writing {value} to {}", path.display()))
}
