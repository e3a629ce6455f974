//! Debian's stock kernels the guests boot, each from the suite whose
//! `linux-image-amd64` names it, fetched with apt through a sources list
//! and package lists of our own under target/guest/apt/<suite> (the host's
//! apt configuration is neither read nor changed), kept in
//! target/guest/kernels until Debian publishes another.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use super::{run, target_dir};

pub const BULLSEYE: &[&str] = &[
    "deb http://deb.debian.org/debian bullseye main",
    "deb http://deb.debian.org/debian-security bullseye-security main",
];
pub const BOOKWORM: &[&str] = &[
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
];
pub const TRIXIE: &[&str] = &[
    "deb http://deb.debian.org/debian trixie main",
    "deb http://deb.debian.org/debian trixie-updates main",
    "deb http://deb.debian.org/debian-security trixie-security main",
];
pub const SID: &[&str] = &["deb http://deb.debian.org/debian sid main"];

/// A kernel line: what `--kernel` names, and where Debian ships it.
pub struct Line {
    /// "6.1": matches 6.1.0-56-amd64, not 6.12...
    pub version: &'static str,
    pub suite: &'static str,
    sources: &'static [&'static str],
}

/// Every kernel the guests boot, oldest first.  5.10 (Debian 11's) is the
/// oldest the daemon supports: the fentry backend and the BPF ring buffer
/// it needs are there (5.5, 5.8), and it is the oldest kernel of a Debian
/// release with security support when this was written.
pub const LINES: &[Line] = &[
    Line { version: "5.10", suite: "bullseye", sources: BULLSEYE },
    Line { version: "6.1", suite: "bookworm", sources: BOOKWORM },
    Line { version: "6.12", suite: "trixie", sources: TRIXIE },
    Line { version: "7.2", suite: "sid", sources: SID },
];
pub const OLDEST: &str = LINES[0].version;
pub const NEWEST: &str = LINES[LINES.len() - 1].version;

/// The line of `version`, or which there are.
pub fn line(version: &str) -> Result<&'static Line> {
    LINES.iter().find(|l| l.version == version).with_context(|| {
        format!("no kernel {version}: {}", LINES.iter().map(|l| l.version).collect::<Vec<_>>().join(", "))
    })
}

/// Whether a kernel release (uname -r) belongs to `version`'s line.
pub fn is_of(release: &str, version: &str) -> bool {
    release.strip_prefix(version).is_some_and(|rest| rest.starts_with(['.', '-', '+']))
}

/// A fetched kernel: its release (uname -r) and its packages: the image
/// and every linux-* package it needs (from 7.2 the image is split into
/// linux-binary-*, linux-modules-*, ...; sid's also needs a newer linux-base).
pub struct Fetched {
    pub release: String,
    pub debs: Vec<PathBuf>,
}

impl Line {
    /// apt-get or apt-cache on this suite's own lists.
    fn apt(&self, tool: &str) -> Result<Command> {
        let dir = target_dir()?.join("guest/apt").join(self.suite);
        for d in ["lists/partial", "cache/archives/partial", "parts"] {
            fs::create_dir_all(dir.join(d))?;
        }
        let list = dir.join("sources.list");
        fs::write(&list, self.sources.join("\n") + "\n")?;
        let mut cmd = Command::new(tool);
        cmd.arg("-q")
            .arg(format!("-oDir::Etc::SourceList={}", list.display()))
            .arg(format!("-oDir::Etc::SourceParts={}", dir.join("parts").display()))
            .arg(format!("-oDir::State::Lists={}", dir.join("lists").display()))
            .arg(format!("-oDir::Cache={}", dir.join("cache").display()));
        Ok(cmd)
    }

    /// The newest kernel of this line the archive has, downloaded if not yet.
    pub fn fetch(&self) -> Result<Fetched> {
        run(self.apt("apt-get")?.args(["-qq", "update"]))
            .with_context(|| format!("apt-get update of {}", self.suite))?;
        let deps = run(self.apt("apt-cache")?.args(["depends", "linux-image-amd64"]))?;
        let image = deps
            .lines()
            .find_map(|l| l.trim().strip_prefix("Depends: ").filter(|d| d.starts_with("linux-image-")))
            .with_context(|| format!("{}'s linux-image-amd64 names no linux-image", self.suite))?
            .to_owned();
        let release = image.trim_start_matches("linux-image-").to_owned();
        if !is_of(&release, self.version) {
            bail!("{}'s kernel is {release}, not {}", self.suite, self.version);
        }
        // The image and the linux-* packages it needs, recursively (a
        // virtual package is printed in <>).
        let tree = run(self.apt("apt-cache")?.args([
            "depends",
            "--recurse",
            "--no-recommends",
            "--no-suggests",
            "--no-conflicts",
            "--no-breaks",
            "--no-replaces",
            "--no-enhances",
            &image,
        ]))?;
        let mut names: Vec<&str> = tree.lines().filter(|l| l.starts_with("linux-")).collect();
        names.sort_unstable();
        names.dedup();
        let dir = target_dir()?.join("guest/kernels");
        fs::create_dir_all(&dir)?;
        // 'URI' file size hash, one a package.
        let uris = run(self.apt("apt-get")?.args(["download", "--print-uris"]).args(&names))?;
        let files: Vec<String> = uris.lines().filter_map(|l| l.split_whitespace().nth(1)).map(str::to_owned).collect();
        if files.len() != names.len() {
            bail!("apt-get download --print-uris named {files:?} for {names:?}");
        }
        if files.iter().any(|f| !dir.join(f).exists()) {
            println!("guest: fetching {} from {}", names.join(" "), self.suite);
            run(self.apt("apt-get")?.arg("download").args(&names).current_dir(&dir))?;
        }
        Ok(Fetched { release, debs: files.iter().map(|f| dir.join(f)).collect() })
    }
}

/// The kernels of `versions`, fetched.
pub fn fetch(versions: &[&str]) -> Result<Vec<Fetched>> {
    versions.iter().map(|v| line(v)?.fetch()).collect()
}

/// A package's name and version from its file name (name_version_arch.deb;
/// apt writes a version's ':' as %3a).
fn name_version(deb: &Path) -> (String, String) {
    let stem = deb.file_stem().unwrap_or_default().to_string_lossy();
    let mut parts = stem.split('_');
    let name = parts.next().unwrap_or_default().to_owned();
    (name, parts.next().unwrap_or_default().replace("%3a", ":"))
}

/// The packages of several kernels to install together: where two need the
/// same package (linux-base), only the newer.
pub fn newest_of_each(fetched: &[Fetched]) -> Result<Vec<PathBuf>> {
    let mut chosen: Vec<PathBuf> = Vec::new();
    for deb in fetched.iter().flat_map(|f| &f.debs) {
        let (name, version) = name_version(deb);
        match chosen.iter().position(|c| name_version(c).0 == name) {
            None => chosen.push(deb.clone()),
            Some(i) => {
                let newer = Command::new("dpkg")
                    .args(["--compare-versions", &version, "gt", &name_version(&chosen[i]).1])
                    .status()?
                    .success();
                if newer {
                    chosen[i] = deb.clone();
                }
            }
        }
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_belongs_to_its_line_only() {
        assert!(is_of("6.1.0-56-amd64", "6.1"));
        assert!(!is_of("6.12.118+deb13-amd64", "6.1"));
        assert!(is_of("6.12.118+deb13-amd64", "6.12"));
        assert!(is_of("7.2.13+deb14-amd64", "7.2"));
    }

    #[test]
    fn package_names_and_versions_from_file_names() {
        let (n, v) = name_version(Path::new("/k/linux-base_4.17_all.deb"));
        assert_eq!((n.as_str(), v.as_str()), ("linux-base", "4.17"));
        let (n, v) = name_version(Path::new("linux-image-6.1.0-56-amd64_6.1.192-2_amd64.deb"));
        assert_eq!((n.as_str(), v.as_str()), ("linux-image-6.1.0-56-amd64", "6.1.192-2"));
    }
}
