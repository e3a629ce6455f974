//! cargo xtask install / uninstall: the files a system service needs, in the
//! standard places (layout::LOCAL), under --root (default /).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::layout::{LOCAL, POLICY_DIR};

/// Where install puts the files, and uninstall removes them from.
#[derive(clap::Args, Debug, PartialEq)]
pub struct Args {
    /// the root the files go under (install) or are removed from (uninstall)
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
}

pub fn install(args: &Args) -> Result<()> {
    let root = &args.root;
    crate::cargo(&["build", "--release", "-p", "writebehindd"])?;
    for f in LOCAL.files()? {
        let dst = root.join(&f.dst);
        fs::create_dir_all(dst.parent().unwrap())?;
        fs::copy(&f.src, &dst).with_context(|| format!("installing {} to {}", f.src.display(), dst.display()))?;
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&dst, fs::Permissions::from_mode(f.mode))?;
        println!("installed {}", dst.display());
    }
    for (shell, dst) in LOCAL.completions() {
        let dst = root.join(dst);
        fs::create_dir_all(dst.parent().unwrap())?;
        fs::write(&dst, completion(shell)?)?;
        println!("installed {}", dst.display());
    }
    fs::create_dir_all(root.join(POLICY_DIR))?;
    println!("policy drop-ins go in {}", root.join(POLICY_DIR).display());
    reload_systemd(root);
    println!("now: systemctl enable --now writebehindd");
    Ok(())
}

/// wbctl's completion script for `shell`, from the release build.
pub fn completion(shell: &str) -> Result<Vec<u8>> {
    let out = Command::new(crate::release_bin("wbctl")).args(["completions", shell]).output()?;
    if !out.status.success() {
        bail!("wbctl completions {shell}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(out.stdout)
}

pub fn uninstall(args: &Args) -> Result<()> {
    let root = &args.root;
    if root == Path::new("/") {
        let _ = Command::new("systemctl").args(["disable", "--now", "writebehindd"]).status();
    }
    let installed = LOCAL.files()?.into_iter().map(|f| f.dst).chain(LOCAL.completions().map(|c| c.1));
    for dst in installed {
        let p = root.join(dst);
        match fs::remove_file(&p) {
            Ok(()) => println!("removed {}", p.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", p.display())),
        }
    }
    let _ = fs::remove_dir(root.join(LOCAL.doc_dir).join("examples"));
    let _ = fs::remove_dir(root.join(LOCAL.doc_dir));
    // Policies are the administrator's: an empty drop-in directory goes, a
    // used one stays.
    let _ = fs::remove_dir(root.join(POLICY_DIR));
    let _ = fs::remove_dir(root.join("etc/writebehindd"));
    reload_systemd(root);
    Ok(())
}

fn reload_systemd(root: &Path) {
    if root == Path::new("/") && Path::new("/run/systemd/system").exists() {
        let _ = Command::new("systemctl").arg("daemon-reload").status();
    }
}
