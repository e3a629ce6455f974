//! cargo xtask rpm [--check]: target/rpm/writebehindd-<version>-1.<arch>.rpm,
//! for Fedora and openSUSE.
//!
//! The same files as the .deb (layout.rs, FEDORA's places), the same
//! generated man pages and unit, staged under target/rpm/root and packed by
//! rpmbuild from a spec written here: a binary package of the release
//! build, no source RPM (the build is `cargo xtask`'s, not rpmbuild's).
//! The scriptlets do what Fedora's %systemd_post, %systemd_preun and
//! %systemd_postun_with_restart expand to, written out: Debian's `rpm`
//! package has no systemd macros.  Unlike the .deb, which enables and
//! starts the service, the RPM leaves that to the system's presets, as
//! Fedora's packaging guidelines ask.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, ensure};

use crate::deb::{PACKAGE, commit_time, control, output, version, write};
use crate::layout::{FEDORA, POLICY_DIR};

const OUT: &str = "target/rpm";
const RELEASE: &str = "1";

/// build target/rpm/writebehindd-<version>-1.<arch>.rpm (release)
#[derive(clap::Args, Debug, Default, PartialEq)]
pub struct Args {
    /// then check it: its file list and scriptlets, and rpmlint (clean but
    /// for the filters in xtask/src/rpm.rs, each explained)
    #[arg(long)]
    pub check: bool,
}

pub fn main(args: &Args) -> Result<()> {
    let start = std::time::Instant::now();
    crate::cargo(&["build", "--release", "-p", "writebehindd"])?;
    let rpm = build()?;
    println!("built {} ({} KiB)", rpm.display(), fs::metadata(&rpm)?.len() / 1024);
    if args.check {
        check(&rpm)?;
        println!("rpm --check: passed in {:.1} s", start.elapsed().as_secs_f64());
    }
    Ok(())
}

/// Stages the tree as the .deb does, in FEDORA's places, writes the spec
/// and runs rpmbuild over it.
fn build() -> Result<PathBuf> {
    let version = version()?;
    let out = std::env::current_dir()?.join(OUT);
    let stage = out.join("root");
    if stage.exists() {
        fs::remove_dir_all(&stage)?;
    }
    crate::deb::stage_files(&FEDORA, &stage, "rpm", &version)?;
    let doc = stage.join(FEDORA.doc_dir);
    write(&doc.join("copyright"), copyright()?.as_bytes())?;

    let spec = out.join("writebehindd.spec");
    write(&spec, spec_text(&version, &stage)?.as_bytes())?;
    let top = out.join("build");
    let rpms = top.join("RPMS");
    if rpms.exists() {
        fs::remove_dir_all(&rpms)?;
    }
    let mut cmd = Command::new("rpmbuild");
    cmd.arg("-bb")
        .arg("--define")
        .arg(format!("_topdir {}", top.display()))
        .arg("--define")
        .arg(format!("stage {}", stage.display()))
        .arg(&spec)
        .env("SOURCE_DATE_EPOCH", commit_time()?);
    let log = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    ensure!(
        log.status.success(),
        "rpmbuild failed:\n{}{}",
        String::from_utf8_lossy(&log.stdout),
        String::from_utf8_lossy(&log.stderr)
    );
    let arch = output(Command::new("rpm").args(["--eval", "%{_arch}"]))?;
    let built = rpms.join(&arch).join(format!("{PACKAGE}-{version}-{RELEASE}.{arch}.rpm"));
    let rpm = out.join(built.file_name().unwrap());
    fs::rename(&built, &rpm).with_context(|| format!("moving {}", built.display()))?;
    Ok(rpm)
}

/// The license, in place of Debian's copyright file: Fedora has no
/// /usr/share/common-licenses, so the package names its license by SPDX
/// id and lists the crates linked in, as the .deb does.
fn copyright() -> Result<String> {
    let deb = control::copyright()?;
    Ok(deb.replace(
        "On Debian systems, the full text of the license is in\n /usr/share/common-licenses/GPL-2.",
        "SPDX: GPL-2.0-only; the full text: https://spdx.org/licenses/GPL-2.0-only.html",
    ))
}

fn spec_text(version: &str, stage: &Path) -> Result<String> {
    let (synopsis, long) = control::description()?;
    // control's long description is folded as a control field: " ." between paragraphs.
    let long: String =
        long.lines().map(|l| if l == " ." { "\n".into() } else { format!("{}\n", l.trim_start()) }).collect();
    let daemon = format!("/{}/writebehindd", FEDORA.daemon_dir);
    let unit = "writebehindd.service";
    let date = output(Command::new("git").args(["log", "-1", "--format=%ad", "--date=format:%a %b %d %Y"]))?;
    let hash = output(Command::new("git").args(["log", "-1", "--format=%h"]))?;
    let mut files = String::new();
    for path in walk(stage)? {
        let rel = path.strip_prefix(stage)?.to_string_lossy().into_owned();
        let line = if rel.starts_with("etc/") {
            format!("%config(noreplace) /{rel}")
        } else if rel.ends_with("/copyright") {
            format!("%license /{rel}")
        } else if rel.starts_with(FEDORA.doc_dir) {
            format!("%doc /{rel}")
        } else {
            format!("/{rel}")
        };
        files += &line;
        files.push('\n');
    }
    Ok(format!(
        r#"# Written by cargo xtask rpm: a binary package of the release build
# staged in %{{stage}}; nothing is compiled here.
%global debug_package %{{nil}}
# The binaries are stripped and the man pages compressed when staged.
%global __os_install_post %{{nil}}
%global _build_id_links none

Name: {PACKAGE}
Version: {version}
Release: {RELEASE}
Summary: {synopsis}
License: GPL-2.0-only

%description
{long}
%install
cp -a %{{stage}}/. %{{buildroot}}/

%post
if [ $1 -eq 1 ] && [ -d /run/systemd/system ]; then
    systemctl --no-reload preset {unit} >/dev/null 2>&1 || :
fi

%preun
if [ $1 -eq 0 ]; then
    if [ -d /run/systemd/system ]; then
        systemctl --no-reload disable --now {unit} >/dev/null 2>&1 || :
    fi
    # Bdi limits a killed daemon left journaled, put back while the binary
    # is here (refused, harmlessly, while a daemon started by hand runs).
    {daemon} --restore || echo "writebehindd: bdi limits not restored (see above)" >&2
fi

%postun
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
    if [ $1 -ge 1 ]; then
        systemctl try-restart {unit} >/dev/null 2>&1 || :
    fi
fi

%files
%dir /etc/writebehindd
%dir /{POLICY_DIR}
%dir /{doc}
%dir /{doc}/examples
{files}
%changelog
* {date} {maintainer} - {version}-{RELEASE}
- Built by cargo xtask rpm from commit {hash}.
"#,
        doc = FEDORA.doc_dir,
        maintainer = control::maintainer()?,
    ))
}

/// Every file under `dir`, sorted.
fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() { out.extend(walk(&p)?) } else { out.push(p) }
    }
    out.sort();
    Ok(out)
}

/// rpmlint's findings that stay, each with its reason; anything else it
/// reports as a warning or an error fails the check.  The first three are
/// also filtered by Fedora's own rpmlint configuration (rpmlint's
/// configs/Fedora/fedora.toml), which Debian's rpmlint does not ship.
const FILTERS: &[(&str, &str)] = &[
    (" no-signature", "a package is signed where it is published, not where it is built (Fedora's filter too)"),
    (" no-group-tag", "Fedora does not use Group: (Fedora's filter too)"),
    (" no-packager-tag", "the build system sets Packager: where it publishes (Fedora's filter too)"),
    (" no-url-tag", "the project has no published home yet: no URL to give"),
    (
        " only-non-binary-in-usr-lib",
        "the unit: systemd reads a package's units from /usr/lib/systemd/system, not /usr/share",
    ),
    (
        " no-manual-page-for-binary (wbctl|writebehindd)$",
        "both pages are packaged (check() asserts it): rpmlint 2.4.0 (Debian 12's) records a page's \
         section, not its name (FilesCheck.py: man_basenames.add(res.group('category'))), so it names every binary",
    ),
];

/// Fedora's settings among rpmlint's: man pages compressed with gzip (its
/// brp-compress), the license by SPDX id (Fedora's rpmlint takes the valid
/// ids from rpmlint-fedora-license-data; this package's is the one here).
fn lint_config() -> String {
    let filters: String = FILTERS.iter().map(|(f, why)| format!("    # {why}\n    '{f}',\n")).collect();
    format!("CompressExtension = \"gz\"\nValidLicenses = [\"GPL-2.0-only\"]\nFilters = [\n{filters}]\n")
}

/// The package's files and scriptlets as rpm reads them back, and rpmlint.
fn check(rpm: &Path) -> Result<()> {
    let list = output(Command::new("rpm").args(["-qlp"]).arg(rpm))?;
    for want in [
        "/usr/sbin/writebehindd",
        "/usr/bin/wbctl",
        "/usr/lib/systemd/system/writebehindd.service",
        "/usr/share/man/man8/writebehindd.8.gz",
        "/usr/share/man/man8/wbctl.8.gz",
        "/usr/share/man/man5/writebehindd.policy.5.gz",
        "/etc/writebehindd/policies.d/README",
        "/usr/share/doc/writebehindd/default.toml",
    ] {
        ensure!(list.lines().any(|l| l == want), "{} lacks {want}:\n{list}", rpm.display());
    }
    let unit = output(Command::new("sh").arg("-c").arg(format!(
        "rpm2cpio {} | cpio -i --to-stdout ./usr/lib/systemd/system/writebehindd.service 2>/dev/null",
        rpm.display()
    )))?;
    ensure!(
        unit.contains("ExecStart=/usr/sbin/writebehindd")
            && unit.contains("ExecStopPost=/usr/sbin/writebehindd --restore"),
        "the packaged unit runs the packaged daemon:\n{unit}"
    );
    let scripts = output(Command::new("rpm").args(["-qp", "--scripts"]).arg(rpm))?;
    ensure!(scripts.contains("/usr/sbin/writebehindd --restore"), "preun restores the knobs:\n{scripts}");
    let requires = output(Command::new("rpm").args(["-qpR"]).arg(rpm))?;
    println!("rpm: {} files; requires: {}", list.lines().count(), requires.lines().collect::<Vec<_>>().join(", "));
    lint(rpm)
}

fn lint(rpm: &Path) -> Result<()> {
    let config = Path::new(OUT).join("rpmlint.toml");
    write(&config, lint_config().as_bytes())?;
    let out = Command::new("rpmlint").arg("--config").arg(&config).arg(rpm).output().context("running rpmlint")?;
    let text = String::from_utf8_lossy(&out.stdout);
    print!("rpmlint:\n{text}");
    let bad: Vec<&str> = text.lines().filter(|l| l.contains(": E: ") || l.contains(": W: ")).collect();
    ensure!(bad.is_empty(), "rpmlint: {} errors or warnings:\n{}", bad.len(), bad.join("\n"));
    ensure!(out.status.success(), "rpmlint failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}
