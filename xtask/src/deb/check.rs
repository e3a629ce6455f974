//! `cargo xtask deb --check`, run by `cargo xtask test`: the built package
//! holds what the issue asks for, lintian has nothing to say beyond the
//! tags explained below, and dpkg installs, upgrades, removes and purges it
//! cleanly (in a throwaway root: tryout.rs). What needs systemd as PID 1
//! (the service actually started, restarted, stopped) is left to the guest
//! that installs the package with apt.

use std::{path::Path, process::Command};

use anyhow::{Result, bail, ensure};

use super::{PACKAGE, output};

/// Paths the issue names, written out rather than taken from layout.rs, so
/// that a change there cannot move them unnoticed.
const MUST_HOLD: &[&str] = &[
    "./usr/sbin/writebehindd",
    "./usr/bin/wbctl",
    "./lib/systemd/system/writebehindd.service",
    "./etc/writebehindd/policies.d/",
    "./usr/share/man/man8/writebehindd.8.gz",
    "./usr/share/man/man8/wbctl.8.gz",
    "./usr/share/man/man5/writebehindd.policy.5.gz",
    "./usr/share/bash-completion/completions/wbctl",
    "./usr/share/zsh/vendor-completions/_wbctl",
    "./usr/share/fish/vendor_completions.d/wbctl.fish",
    "./usr/share/doc/writebehindd/README.md",
    "./usr/share/doc/writebehindd/copyright",
    "./usr/share/doc/writebehindd/changelog.gz",
    "./usr/share/doc/writebehindd/examples/backup.toml",
];

pub fn run(deb: &Path) -> Result<()> {
    let list = output(Command::new("dpkg-deb").arg("--contents").arg(deb))?;
    let paths: Vec<&str> = list.lines().filter_map(|l| l.split_whitespace().nth(5)).collect();
    for want in MUST_HOLD {
        ensure!(paths.contains(want), "the package lacks {want}");
    }
    ensure!(!paths.iter().any(|p| p.contains("/local/")), "the package installs under /usr/local");

    let field = |name: &str| output(Command::new("dpkg-deb").arg("--field").arg(deb).arg(name));
    ensure!(field("Package")? == PACKAGE);
    ensure!(field("Version")? == super::version()?, "Version is not the Cargo.toml version");
    ensure!(field("Depends")?.contains("libc6"), "Depends lacks libc6 (dpkg-shlibdeps)");
    let conffiles = output(Command::new("dpkg-deb").arg("--info").arg(deb).arg("conffiles"))?;
    ensure!(conffiles == "/etc/writebehindd/policies.d/README", "conffiles: {conffiles:?}");

    unit(deb)?;
    super::lintian::check(deb)?;
    // Not current_exe(): `cargo xtask test` relinks target/debug/xtask while
    // this process runs it (CI failed with ENOENT there); /proc/self/exe is
    // always this very binary.
    let tryout = Command::new("/proc/self/exe").arg("deb-tryout").arg(deb).status()?;
    ensure!(tryout.success(), "installing and purging the package failed");
    println!("deb check: {} passed", deb.display());
    Ok(())
}

/// The packaged unit starts the packaged binary, and nothing in it that
/// systemd reads still points at /usr/local.
fn unit(deb: &Path) -> Result<()> {
    let tar = Command::new("dpkg-deb").arg("--fsys-tarfile").arg(deb).output()?;
    let dir = Path::new(super::OUT).join("check");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("data.tar"), &tar.stdout)?;
    let unit = output(
        Command::new("tar").arg("-xOf").arg(dir.join("data.tar")).arg("./lib/systemd/system/writebehindd.service"),
    )?;
    let settings: Vec<&str> = unit.lines().filter(|l| !l.starts_with('#')).collect();
    ensure!(settings.contains(&"ExecStart=/usr/sbin/writebehindd"), "the packaged unit's ExecStart:\n{unit}");
    if let Some(l) = settings.iter().find(|l| l.contains("/usr/local")) {
        bail!("the packaged unit still says {l:?}");
    }
    Ok(())
}
