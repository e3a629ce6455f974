//! `xtask deb-tryout DEB` (run by `deb --check`): install, upgrade, remove
//! and purge the package with dpkg in a throwaway root, and check what each
//! step leaves.
//!
//! The root is this machine's own / under an overlay whose upper layer is a
//! tmpfs, in a mount namespace of this process: the maintainer scripts find
//! the real dpkg database, perl and deb-systemd-helper, and everything they
//! write lands in the tmpfs, which goes with the namespace. The host's /etc,
//! /lib and dpkg database are never touched. /run is an empty tmpfs, so
//! systemd does not look like PID 1 there (as on this machine) and
//! deb-systemd-invoke is not called; /sys is not mounted at all, so
//! `writebehindd --restore` cannot reach a real bdi knob.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail, ensure};

use super::{OUT, PACKAGE, output, run};
use crate::layout::{DEBIAN, POLICY_DIR};

const ENABLED: &str = "etc/systemd/system/multi-user.target.wants/writebehindd.service";
const MASKED: &str = "etc/systemd/system/writebehindd.service";
const JOURNAL: &str = "run/writebehindd/paced-bdis";

pub fn main(args: &[String]) -> Result<()> {
    let [deb] = args else { bail!("usage: xtask deb-tryout DEB") };
    let deb = std::path::absolute(deb)?;
    let root = throwaway_root()?;
    let dpkg = |args: &[&str]| {
        run(Command::new("dpkg").arg(format!("--root={}", root.display())).args(args).env("PATH", PATH))
    };

    dpkg(&["-i", deb.to_str().unwrap()])?;
    installed(&root)?;
    // The same version again: postinst runs as on an upgrade ("configure"
    // with the old version), and an enabled unit stays enabled.
    dpkg(&["-i", deb.to_str().unwrap()])?;
    installed(&root)?;

    // A journal a killed daemon left: prerm's --restore must consume it.
    // (Its bdi does not exist, and /sys is empty here anyway.)
    fs::create_dir_all(root.join(JOURNAL).parent().unwrap())?;
    fs::write(root.join(JOURNAL), "wb-deb-tryout\t1000000\t0\t*\t*\n")?;
    dpkg(&["-r", PACKAGE])?;
    ensure!(!root.join(JOURNAL).exists(), "prerm did not run writebehindd --restore: the journal is still there");
    ensure!(!root.join(DEBIAN.daemon_dir).join("writebehindd").exists(), "remove left the daemon");
    ensure!(root.join(POLICY_DIR).join("README").exists(), "remove (not purge) must keep the conffiles");
    ensure!(link(&root, MASKED)? == "/dev/null", "postrm remove did not mask the unit");

    // A policy of the administrator's own goes with the purge too.
    std::fs::write(root.join(POLICY_DIR).join("local.toml"), "burst = \"8MiB\"\n")?;
    dpkg(&["-P", PACKAGE])?;
    ensure!(!root.join("run/writebehindd").exists(), "purge left /run/writebehindd");
    ensure!(!root.join("etc/writebehindd").exists(), "purge left /etc/writebehindd");
    let left = leftovers(&root.parent().unwrap().join("upper"))?;
    ensure!(left.is_empty(), "purge left these behind: {left:?}");
    println!("deb tryout: installed, reinstalled, removed and purged in a throwaway root; nothing left");
    Ok(())
}

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Mounts the overlay (see the module's comment) and returns its root.
fn throwaway_root() -> Result<PathBuf> {
    // SAFETY: plain syscall; this process is single-threaded here.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(std::io::Error::last_os_error()).context("unshare(CLONE_NEWNS): needs root");
    }
    // Nothing mounted from here on may reach the host's namespace.
    run(Command::new("mount").args(["--make-rprivate", "/"]))?;
    let base = std::path::absolute(Path::new(OUT).join("tryout"))?;
    fs::create_dir_all(&base)?;
    mount(&["-t", "tmpfs", "tryout", base.to_str().unwrap()])?;
    for d in ["upper", "work", "root"] {
        fs::create_dir(base.join(d))?;
    }
    let root = base.join("root");
    let layers = format!("lowerdir=/,upperdir={0}/upper,workdir={0}/work", base.display());
    mount(&["-t", "overlay", "overlay", "-o", &layers, root.to_str().unwrap()])?;
    mount(&["-t", "proc", "proc", root.join("proc").to_str().unwrap()])?;
    mount(&["--bind", "/dev", root.join("dev").to_str().unwrap()])?;
    mount(&["-t", "tmpfs", "run", root.join("run").to_str().unwrap()])?;
    Ok(root)
}

fn mount(args: &[&str]) -> Result<()> {
    run(Command::new("mount").args(args))
}

/// What an installed package must have done.
fn installed(root: &Path) -> Result<()> {
    let daemon = format!("/{}/writebehindd", DEBIAN.daemon_dir);
    let version = output(Command::new("chroot").arg(root).args([daemon.as_str(), "--version"]))?;
    ensure!(version.starts_with("writebehindd "), "the packaged daemon said {version:?}");
    let unit = format!("/{}/writebehindd.service", DEBIAN.unit_dir);
    ensure!(link(root, ENABLED)? == unit, "postinst did not enable the unit");
    ensure!(!root.join(MASKED).exists(), "postinst left the unit masked");
    // systemd's own reading of the installed unit: its settings, and that
    // the binaries and man pages it names are there.
    run(Command::new("chroot").arg(root).args(["systemd-analyze", "verify", &unit]))
        .context("systemd-analyze verify rejects the installed unit")?;
    Ok(())
}

fn link(root: &Path, path: &str) -> Result<String> {
    let target = fs::read_link(root.join(path)).with_context(|| format!("/{path} is no symlink"))?;
    Ok(target.to_string_lossy().into_owned())
}

/// What the overlay's upper layer holds that the host does not: files
/// anywhere, and directories that are new. dpkg's own records and logs,
/// and man-db's index (its trigger rebuilt it), are expected.
fn leftovers(upper: &Path) -> Result<Vec<String>> {
    let mut left = Vec::new();
    let mut todo = vec![upper.to_owned()];
    while let Some(dir) = todo.pop() {
        for e in fs::read_dir(&dir)? {
            let path = e?.path();
            let rel = path.strip_prefix(upper)?.to_string_lossy().into_owned();
            let expected = ["var/lib/dpkg", "var/log/", "var/cache/man"];
            if expected.iter().any(|e| rel.starts_with(e)) || rel == "tmp" {
                continue;
            }
            let dir = path.is_dir() && !path.is_symlink();
            if !dir || !Path::new("/").join(&rel).exists() {
                left.push(format!("/{rel}"));
            }
            if dir {
                todo.push(path);
            }
        }
    }
    left.sort();
    Ok(left)
}
