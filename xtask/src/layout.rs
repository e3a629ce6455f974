//! Which files a system install holds, and where: one list for `cargo xtask
//! install` (the /usr/local layout) and `cargo xtask deb` (Debian's), so the
//! two cannot drift apart.

use std::path::PathBuf;

use anyhow::{Context, Result};

/// Where each kind of file goes, relative to the root.
pub struct Layout {
    pub daemon_dir: &'static str,
    pub cli_dir: &'static str,
    pub unit_dir: &'static str,
    pub doc_dir: &'static str,
    /// bash, zsh and fish look here for completions of this layout.
    pub bash_completions: &'static str,
    pub zsh_completions: &'static str,
    pub fish_completions: &'static str,
}

/// `cargo xtask install`: the administrator's own places.
/// systemd/writebehindd.service is written for these paths.
pub const LOCAL: Layout = Layout {
    daemon_dir: "usr/local/bin",
    cli_dir: "usr/local/bin",
    unit_dir: "etc/systemd/system",
    doc_dir: "usr/local/share/doc/writebehindd",
    bash_completions: "usr/local/share/bash-completion/completions",
    zsh_completions: "usr/local/share/zsh/site-functions",
    fish_completions: "usr/local/share/fish/vendor_completions.d",
};

/// The Debian package: the distribution's places (FHS, Debian policy 9.1).
pub const DEBIAN: Layout = Layout {
    daemon_dir: "usr/sbin",
    cli_dir: "usr/bin",
    unit_dir: "lib/systemd/system",
    doc_dir: "usr/share/doc/writebehindd",
    bash_completions: "usr/share/bash-completion/completions",
    zsh_completions: "usr/share/zsh/vendor-completions",
    fish_completions: "usr/share/fish/vendor_completions.d",
};

/// The RPM (Fedora's places: units under /usr/lib, zsh's site-functions).
pub const FEDORA: Layout = Layout {
    daemon_dir: "usr/sbin",
    cli_dir: "usr/bin",
    unit_dir: "usr/lib/systemd/system",
    doc_dir: "usr/share/doc/writebehindd",
    bash_completions: "usr/share/bash-completion/completions",
    zsh_completions: "usr/share/zsh/site-functions",
    fish_completions: "usr/share/fish/vendor_completions.d",
};

/// Policy drop-ins: the administrator's, in both layouts.
pub const POLICY_DIR: &str = "etc/writebehindd/policies.d";
pub const UNIT: &str = "systemd/writebehindd.service";

/// A file copied as it is: from the repository or the build, to a path
/// under the root.
pub struct Installed {
    pub src: PathBuf,
    pub dst: String,
    pub mode: u32,
}

impl Layout {
    /// Every file copied as it is, in an order that is the same for every
    /// layout (`rewrite` pairs them up by position).
    pub fn files(&self) -> Result<Vec<Installed>> {
        let file = |src: PathBuf, dir: &str, name: &str, mode| Installed { src, dst: format!("{dir}/{name}"), mode };
        let mut v = vec![
            file(crate::release_bin("writebehindd"), self.daemon_dir, "writebehindd", 0o755),
            file(crate::release_bin("wbctl"), self.cli_dir, "wbctl", 0o755),
            file(UNIT.into(), self.unit_dir, "writebehindd.service", 0o644),
            file("README.md".into(), self.doc_dir, "README.md", 0o644),
            file("policies/README.md".into(), self.doc_dir, "policies.md", 0o644),
            file("policies/default.toml".into(), self.doc_dir, "default.toml", 0o644),
        ];
        for example in examples()? {
            let name = example.file_name().unwrap().to_string_lossy().into_owned();
            v.push(file(example, &format!("{}/examples", self.doc_dir), &name, 0o644));
        }
        Ok(v)
    }

    /// (shell as `wbctl completions` names it, destination) for wbctl's
    /// completion scripts. The daemon is started by systemd, not typed.
    pub fn completions(&self) -> [(&'static str, String); 3] {
        [
            ("bash", format!("{}/wbctl", self.bash_completions)),
            ("zsh", format!("{}/_wbctl", self.zsh_completions)),
            ("fish", format!("{}/wbctl.fish", self.fish_completions)),
        ]
    }

    /// `text` (the unit, written for `from`) with every installed path of
    /// `from` replaced by the same file's path in this layout.
    pub fn rewrite(&self, text: &str, from: &Layout) -> Result<String> {
        let mut out = text.to_owned();
        for (a, b) in from.files()?.iter().zip(self.files()?) {
            out = out.replace(&format!("/{}", a.dst), &format!("/{}", b.dst));
        }
        Ok(out)
    }
}

/// policies/examples/*.toml, sorted: a new example is installed without
/// being listed here.
fn examples() -> Result<Vec<PathBuf>> {
    let dir = "policies/examples";
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {dir}"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    v.sort();
    Ok(v)
}
