//! The package's metadata: DEBIAN/control, conffiles and md5sums, and the
//! copyright and changelog every Debian package carries.

use std::{fs, path::Path, process::Command};

use anyhow::{Context, Result, bail};

use super::{PACKAGE, output};

/// Shipped as /etc/writebehindd/policies.d/README, a conffile (like
/// /etc/sudoers.d/README): the directory's one file the package owns. A
/// commented-out policy cannot take its place: the daemon refuses a .toml
/// file that sets no key.
pub const POLICY_README: &str = "\
Policy drop-ins for writebehindd: *.toml files here are applied in name
order over the embedded default. The format and every key: man
writebehindd.policy; ready-made files to copy here:
/usr/share/doc/writebehindd/examples/. Check a file with
writebehindd --check-policy FILE, then: systemctl reload writebehindd.
";

pub struct Fields {
    pub version: String,
    pub arch: String,
    pub depends: String,
}

pub fn control(f: &Fields, stage: &Path) -> Result<String> {
    let (synopsis, long) = description()?;
    Ok(format!(
        "Package: {PACKAGE}\nVersion: {}\nArchitecture: {}\nMaintainer: {}\nInstalled-Size: {}\nDepends: {}\n\
         Section: admin\nPriority: optional\nDescription: {synopsis}\n{long}",
        f.version,
        f.arch,
        maintainer()?,
        installed_kib(stage)?,
        f.depends,
    ))
}

/// The synopsis from agent/Cargo.toml's description (before its colon),
/// the long description from the rest and the README's first paragraph,
/// folded as control fields are.
pub fn description() -> Result<(String, String)> {
    let toml = fs::read_to_string("agent/Cargo.toml")?;
    let desc = toml
        .lines()
        .find_map(|l| l.strip_prefix("description = \""))
        .and_then(|l| l.strip_suffix('"'))
        .context("agent/Cargo.toml has no description")?;
    let (synopsis, rest) = desc.split_once(": ").unwrap_or((desc, ""));
    let readme = fs::read_to_string("README.md")?;
    let intro = readme.split("\n\n").nth(1).context("README.md: no first paragraph")?;
    let mut rest = rest.to_owned();
    if let Some(first) = rest.get(..1) {
        rest = first.to_uppercase() + &rest[1..] + ".";
    }
    let text = format!("{rest}\n\n{}", intro.replace('`', ""));
    let long = text.split("\n\n").map(|p| fold(p, 72)).collect::<Vec<_>>().join(" .\n");
    Ok((synopsis.to_owned(), long))
}

/// One paragraph of a long description: lines of at most `width`, each
/// starting with a space.
fn fold(paragraph: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in paragraph.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            out += &format!(" {line}\n");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line += word;
    }
    out + &format!(" {line}\n")
}

/// Who the project's first commit names: the project's maintainers.
pub fn maintainer() -> Result<String> {
    let root = output(Command::new("git").args(["rev-list", "--max-parents=0", "HEAD"]))?;
    let first = root.lines().next().context("git: no root commit")?;
    output(Command::new("git").args(["log", "-1", "--format=%an <%ae>", first]))
}

/// The shared libraries the binaries link, as dpkg-shlibdeps words them,
/// and init-system-helpers for the maintainer scripts.
pub fn depends(stage: &Path) -> Result<String> {
    // dpkg-shlibdeps wants a source tree: a debian/control naming the package.
    let src = Path::new(super::OUT).join("shlibs");
    fs::create_dir_all(src.join("debian"))?;
    fs::write(src.join("debian/control"), format!("Source: {PACKAGE}\n\nPackage: {PACKAGE}\nArchitecture: any\n"))?;
    let stage = fs::canonicalize(stage)?;
    let mut cmd = Command::new("dpkg-shlibdeps");
    cmd.current_dir(&src).arg("-O");
    for f in crate::layout::DEBIAN.files()?.iter().filter(|f| f.mode & 0o111 != 0) {
        cmd.arg(format!("-e{}", stage.join(&f.dst).display()));
    }
    let out = output(&mut cmd)?;
    let libs = out.strip_prefix("shlibs:Depends=").with_context(|| format!("dpkg-shlibdeps said {out:?}"))?;
    Ok(format!("{libs}, init-system-helpers (>= 1.54~)"))
}

/// KiB the files take once installed, as dpkg-gencontrol counts them.
fn installed_kib(stage: &Path) -> Result<u64> {
    let mut kib = 0;
    for entry in walk(stage)? {
        if !entry.starts_with(stage.join("DEBIAN")) {
            kib += fs::symlink_metadata(&entry)?.len().div_ceil(1024).max(1);
        }
    }
    Ok(kib)
}

/// Every file under /etc: dpkg keeps the administrator's changes to them.
pub fn conffiles(stage: &Path) -> Result<String> {
    let mut out = String::new();
    for f in walk(&stage.join("etc"))? {
        out += &format!("/{}\n", f.strip_prefix(stage)?.display());
    }
    Ok(out)
}

pub fn md5sums(stage: &Path) -> Result<String> {
    let files: Vec<_> = walk(stage)?
        .into_iter()
        .filter(|f| !f.starts_with(stage.join("DEBIAN")))
        .map(|f| f.strip_prefix(stage).unwrap().to_owned())
        .collect();
    let mut cmd = Command::new("md5sum");
    cmd.current_dir(stage).args(&files);
    Ok(output(&mut cmd)? + "\n")
}

/// The files (not directories) under `dir`, sorted.
fn walk(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let p = e?.path();
            if p.is_dir() { todo.push(p) } else { out.push(p) }
        }
    }
    out.sort();
    Ok(out)
}

/// Machine-readable (DEP-5): the project's license, in Debian's words.
pub fn copyright() -> Result<String> {
    let toml = fs::read_to_string("Cargo.toml")?;
    let spdx = toml.lines().find_map(|l| l.strip_prefix("license = \"")).context("Cargo.toml: no license")?;
    let (name, text) = match spdx.trim_end_matches('"') {
        "GPL-2.0-only" => ("GPL-2", "/usr/share/common-licenses/GPL-2"),
        other => bail!("no Debian license name for {other:?}: add it to xtask/src/deb/control.rs"),
    };
    Ok(format!(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\nUpstream-Name: {PACKAGE}\n\
         Comment: The binaries also contain these Rust crates, each under the\n license its Cargo.toml states:\n{}\n\n\
         Files: *\nCopyright: {} {}\nLicense: {name}\n On Debian systems, the full text of the license is in\n {text}.\n",
        crates()?,
        years()?,
        maintainer()?
    ))
}

/// " name version: license" for every crate linked into the binaries: the
/// daemon's normal dependencies, transitively (build scripts' and tests'
/// are not shipped).
fn crates() -> Result<String> {
    let target = output(Command::new("rustc").args(["--print", "host-tuple"]))?;
    let meta =
        output(Command::new(env!("CARGO")).args(["metadata", "--format-version", "1", "--filter-platform", &target]))?;
    let meta: serde_json::Value = serde_json::from_str(&meta)?;
    let packages = meta["packages"].as_array().context("cargo metadata: no packages")?;
    let nodes = meta["resolve"]["nodes"].as_array().context("cargo metadata: no resolve")?;
    let root = packages.iter().find(|p| p["name"] == PACKAGE).context("cargo metadata: no writebehindd")?;
    let mut linked = std::collections::BTreeSet::new();
    let mut todo = vec![root["id"].clone()];
    while let Some(id) = todo.pop() {
        let node = nodes.iter().find(|n| n["id"] == id).context("cargo metadata: a package without a node")?;
        for dep in node["deps"].as_array().into_iter().flatten() {
            let normal = dep["dep_kinds"].as_array().into_iter().flatten().any(|k| k["kind"].is_null());
            if normal && linked.insert(dep["pkg"].to_string()) {
                todo.push(dep["pkg"].clone());
            }
        }
    }
    let mut lines: Vec<String> = packages
        .iter()
        .filter(|p| linked.contains(&p["id"].to_string()))
        .map(|p| {
            format!(
                " {} {}: {}",
                p["name"].as_str().unwrap_or("?"),
                p["version"].as_str().unwrap_or("?"),
                p["license"].as_str().unwrap_or("unstated")
            )
        })
        .collect();
    lines.sort();
    Ok(lines.join("\n"))
}

/// The years the history spans, as "2025-2026" or "2026".
fn years() -> Result<String> {
    let all = output(Command::new("git").args(["log", "--format=%ad", "--date=format:%Y"]))?;
    let (first, last) = (all.lines().last().unwrap_or_default(), all.lines().next().unwrap_or_default());
    Ok(if first == last { last.to_owned() } else { format!("{first}-{last}") })
}

/// A native package's changelog: one entry for this build, dated by the
/// commit it was built from.
pub fn changelog(version: &str) -> Result<String> {
    let hash = output(Command::new("git").args(["log", "-1", "--format=%h"]))?;
    let date = output(Command::new("git").args(["log", "-1", "--format=%aD"]))?;
    Ok(format!(
        "{PACKAGE} ({version}) unstable; urgency=medium\n\n  * Built by cargo xtask deb from commit {hash}.\n\n -- {}  {date}\n",
        maintainer()?
    ))
}
