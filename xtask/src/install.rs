//! cargo xtask install / uninstall: the files a system service needs, in the
//! standard places, under --root (default /).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

/// (source in the repository or build, destination under the root, mode)
fn files() -> Vec<(PathBuf, &'static str, u32)> {
    vec![
        (crate::release_bin("writebehindd"), "usr/local/bin/writebehindd", 0o755),
        (crate::release_bin("wbctl"), "usr/local/bin/wbctl", 0o755),
        ("systemd/writebehindd.service".into(), "etc/systemd/system/writebehindd.service", 0o644),
        ("README.md".into(), "usr/local/share/doc/writebehindd/README.md", 0o644),
        ("policies/README.md".into(), "usr/local/share/doc/writebehindd/policies.md", 0o644),
        ("policies/default.toml".into(), "usr/local/share/doc/writebehindd/default.toml", 0o644),
        ("policies/examples/backup.toml".into(), "usr/local/share/doc/writebehindd/examples/backup.toml", 0o644),
        (
            "policies/examples/database-off.toml".into(),
            "usr/local/share/doc/writebehindd/examples/database-off.toml",
            0o644,
        ),
        ("policies/examples/desktop.toml".into(), "usr/local/share/doc/writebehindd/examples/desktop.toml", 0o644),
    ]
}

const COMPLETION: &str = "usr/local/share/bash-completion/completions/wbctl";
const POLICY_DIR: &str = "etc/writebehindd/policies.d";

fn root(args: &[String]) -> Result<PathBuf> {
    match args {
        [] => Ok("/".into()),
        [flag, dir] if flag == "--root" => Ok(dir.into()),
        _ => bail!("usage: cargo xtask install|uninstall [--root DIR]"),
    }
}

pub fn install(args: &[String]) -> Result<()> {
    let root = root(args)?;
    crate::cargo(&["build", "--release", "-p", "writebehindd"])?;
    for (src, dst, mode) in files() {
        let dst = root.join(dst);
        fs::create_dir_all(dst.parent().unwrap())?;
        fs::copy(&src, &dst).with_context(|| format!("installing {} to {}", src.display(), dst.display()))?;
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&dst, fs::Permissions::from_mode(mode))?;
        println!("installed {}", dst.display());
    }
    let completion = Command::new(crate::release_bin("wbctl")).args(["completions", "bash"]).output()?;
    let dst = root.join(COMPLETION);
    fs::create_dir_all(dst.parent().unwrap())?;
    fs::write(&dst, completion.stdout)?;
    fs::create_dir_all(root.join(POLICY_DIR))?;
    println!("installed {}; policy drop-ins go in {}", dst.display(), root.join(POLICY_DIR).display());
    reload_systemd(&root);
    println!("now: systemctl enable --now writebehindd");
    Ok(())
}

pub fn uninstall(args: &[String]) -> Result<()> {
    let root = root(args)?;
    if root == Path::new("/") {
        let _ = Command::new("systemctl").args(["disable", "--now", "writebehindd"]).status();
    }
    for dst in files().iter().map(|f| f.1).chain([COMPLETION]) {
        let p = root.join(dst);
        match fs::remove_file(&p) {
            Ok(()) => println!("removed {}", p.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", p.display())),
        }
    }
    let _ = fs::remove_dir(root.join("usr/local/share/doc/writebehindd/examples"));
    let _ = fs::remove_dir(root.join("usr/local/share/doc/writebehindd"));
    // Policies are the administrator's: an empty drop-in directory goes, a
    // used one stays.
    let _ = fs::remove_dir(root.join(POLICY_DIR));
    let _ = fs::remove_dir(root.join("etc/writebehindd"));
    reload_systemd(&root);
    Ok(())
}

fn reload_systemd(root: &Path) {
    if root == Path::new("/") && Path::new("/run/systemd/system").exists() {
        let _ = Command::new("systemctl").arg("daemon-reload").status();
    }
}
