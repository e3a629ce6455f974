//! cargo xtask deb [--check]: target/deb/writebehindd_<version>_<arch>.deb.
//!
//! Built here with dpkg-deb rather than with cargo-deb: the files and their
//! places come from the same list as `cargo xtask install` (layout.rs), the
//! unit is rewritten from systemd/writebehindd.service at package time, man
//! pages and maintainer scripts are generated next to it, and nothing needs
//! building first (cargo-deb would be one more tool to compile in CI, and
//! would keep its own file list in agent/Cargo.toml).

mod check;
pub mod control;
mod lintian;
pub mod man;
mod scripts;
mod tryout;

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::layout::{DEBIAN, LOCAL, POLICY_DIR, UNIT};

pub const PACKAGE: &str = "writebehindd";
const OUT: &str = "target/deb";

pub use tryout::main as tryout;

/// build target/deb/writebehindd_<version>_<arch>.deb (release)
#[derive(clap::Args, Debug, Default, PartialEq)]
pub struct Args {
    /// then check it (what `test` runs): its contents, lintian,
    /// install/upgrade/remove/purge in a throwaway root
    #[arg(long)]
    pub check: bool,
}

pub fn main(args: &Args) -> Result<()> {
    let deb = package()?;
    if args.check {
        check::run(&deb)?;
    }
    Ok(())
}

/// The release build, packed: the .deb's path.
pub fn package() -> Result<PathBuf> {
    crate::cargo(&["build", "--release", "-p", "writebehindd"])?;
    let deb = build()?;
    println!("built {} ({} KiB)", deb.display(), fs::metadata(&deb)?.len() / 1024);
    Ok(deb)
}

/// Stages the package's tree under target/deb/root and packs it.
fn build() -> Result<PathBuf> {
    let version = version()?;
    let arch = output(Command::new("dpkg").arg("--print-architecture"))?;
    let stage = Path::new(OUT).join("root");
    if stage.exists() {
        fs::remove_dir_all(&stage)?;
    }
    stage_files(&DEBIAN, &stage, "deb", &version)?;
    write(&stage.join(lintian::FILE), lintian::overrides().as_bytes())?;
    let doc = stage.join(DEBIAN.doc_dir);
    write(&doc.join("copyright"), control::copyright()?.as_bytes())?;
    write(&doc.join("changelog"), control::changelog(&version)?.as_bytes())?;
    gzip(&doc.join("changelog"))?;

    let meta = stage.join("DEBIAN");
    let fields = control::Fields { version: version.clone(), arch: arch.clone(), depends: control::depends(&stage)? };
    write(&meta.join("control"), control::control(&fields, &stage)?.as_bytes())?;
    write(&meta.join("conffiles"), control::conffiles(&stage)?.as_bytes())?;
    write(&meta.join("md5sums"), control::md5sums(&stage)?.as_bytes())?;
    for (name, text) in scripts::all() {
        write(&meta.join(name), text.as_bytes())?;
        fs::set_permissions(meta.join(name), fs::Permissions::from_mode(0o755))?;
    }
    let deb = Path::new(OUT).join(format!("{PACKAGE}_{version}_{arch}.deb"));
    // Times clamped to the commit's: the same source, the same package.
    let mut pack = Command::new("dpkg-deb");
    pack.args(["--root-owner-group", "-Zxz", "--build"]).arg(&stage).arg(&deb);
    run(pack.env("SOURCE_DATE_EPOCH", commit_time()?))?;
    Ok(deb)
}

/// A package's files in `layout`'s places under `stage`: the layout's
/// files (the unit rewritten for it, executables stripped), shell
/// completions, man pages and the policy directory's README.  The .deb's
/// and the RPM's, built by `cargo xtask <by>`.
pub fn stage_files(layout: &crate::layout::Layout, stage: &Path, by: &str, version: &str) -> Result<()> {
    for f in layout.files()? {
        let dst = stage.join(&f.dst);
        fs::create_dir_all(dst.parent().unwrap())?;
        if f.src == Path::new(UNIT) {
            fs::write(&dst, unit_for(layout, by)?)?;
        } else {
            fs::copy(&f.src, &dst).with_context(|| format!("staging {}", f.src.display()))?;
        }
        fs::set_permissions(&dst, fs::Permissions::from_mode(f.mode))?;
        if f.mode & 0o111 != 0 {
            // As dh_strip does for executables; the debug symbols stay in
            // the build, no -dbgsym package.
            run(Command::new("strip").args(["--remove-section=.comment", "--remove-section=.note"]).arg(&dst))?;
        }
    }
    for (shell, dst) in layout.completions() {
        write(&stage.join(dst), &crate::install::completion(shell)?)?;
    }
    man::write_all(stage, version)?;
    write(&stage.join(POLICY_DIR).join("README"), control::POLICY_README.as_bytes())
}

/// The repository's unit with its paths moved from the /usr/local layout
/// it is written for to the package's: one unit file, not two. The man
/// pages only the package has are added to its documentation.  The unit
/// for a package of `layout`, built by `cargo xtask <by>`.
pub fn unit_for(layout: &crate::layout::Layout, by: &str) -> Result<String> {
    let text = fs::read_to_string(UNIT).with_context(|| format!("reading {UNIT}"))?;
    let mut out = format!(
        "# Packaged by cargo xtask {by} from systemd/writebehindd.service, with its paths\n\
         # moved to the package's (the comments about cargo xtask install are the original's).\n",
    );
    for line in layout.rewrite(&text, &LOCAL)?.lines() {
        out += line;
        out.push('\n');
        if line == "[Unit]" {
            out += "Documentation=man:writebehindd(8) man:writebehindd.policy(5) man:wbctl(8)\n";
        }
    }
    Ok(out)
}

/// The daemon's version, as its Cargo.toml says (what --version prints).
pub fn version() -> Result<String> {
    let meta = output(Command::new(env!("CARGO")).args(["metadata", "--no-deps", "--format-version", "1"]))?;
    let meta: serde_json::Value = serde_json::from_str(&meta)?;
    let packages = meta["packages"].as_array().context("cargo metadata: no packages")?;
    let agent = packages.iter().find(|p| p["name"] == PACKAGE).context("cargo metadata: no writebehindd")?;
    Ok(agent["version"].as_str().context("cargo metadata: no version")?.to_owned())
}

/// The commit's time, in seconds since the epoch, for SOURCE_DATE_EPOCH.
pub fn commit_time() -> Result<String> {
    output(Command::new("git").args(["log", "-1", "--format=%ct"]))
}

pub fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    fs::create_dir_all(path.parent().unwrap())?;
    fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644))?;
    Ok(())
}

/// gzip -9n, as Debian ships man pages and changelogs (no name or time
/// in the header, so the package is reproducible).
pub fn gzip(path: &Path) -> Result<()> {
    run(Command::new("gzip").args(["-9nf"]).arg(path))
}

pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// A command's standard output, trimmed; its failure with its stderr.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}
