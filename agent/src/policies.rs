//! The policy set: the embedded default, then policy files in name order
//! (/etc/writebehindd/policies.d/*.toml, like systemd drop-ins), resolved
//! per cgroup path.
//!
//! A file's top-level keys apply to the root cgroup "/" and so, by
//! inheritance, to every cgroup.  Its `[[policy]]` tables apply to the
//! cgroups their `cgroup` pattern matches ("/system.slice/backup.service",
//! "/user.slice/**", "/user.slice/user-*.slice").  For a cgroup, the most
//! specific matching table wins; what it leaves out comes from the policy
//! of the parent cgroup, then the root, then the embedded default.  Among
//! equally specific tables, the later file wins.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use crate::policy::{DEVICE_WIDE, Layer, Mode, Policy};

mod pattern;

use pattern::{Pattern, States};

pub const POLICY_DIR: &str = "/etc/writebehindd/policies.d";

/// One `[[policy]]` table.
#[derive(Debug, Clone)]
struct Rule {
    pattern: Pattern,
    layer: Layer,
    source: String,
}

#[derive(Debug, Clone)]
pub struct PolicySet {
    root: Policy,
    rules: Vec<Rule>,
    /// Where the policies came from, in the order applied.
    pub sources: Vec<String>,
    /// The whole daemon observes (`observing`).
    observe_all: bool,
}

/// `dir`'s *.toml files in name order; no directory means no files.
pub fn dir_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

impl PolicySet {
    /// The embedded default alone.
    pub fn embedded() -> Self {
        Self {
            root: Policy::embedded_default(),
            rules: Vec::new(),
            sources: vec!["(embedded default)".into()],
            observe_all: false,
        }
    }

    /// The embedded default, then each file in order.  An error names the
    /// file and, from the TOML parser, the line, column and key.
    pub fn load(files: &[PathBuf]) -> Result<Self> {
        let mut texts = Vec::new();
        for f in files {
            let bytes = std::fs::read(f).with_context(|| format!("{}: cannot read", f.display()))?;
            let text = String::from_utf8(bytes).map_err(|e| {
                anyhow::anyhow!("{}: not UTF-8 text (byte {})", f.display(), e.utf8_error().valid_up_to())
            })?;
            texts.push((f.display().to_string(), text));
        }
        Self::from_texts(&texts)
    }

    /// Like `load`, from (name, text) pairs.
    pub fn from_texts(texts: &[(String, String)]) -> Result<Self> {
        let mut set = Self::embedded();
        for (name, text) in texts {
            set.add(name, text).with_context(|| name.clone())?;
        }
        Ok(set)
    }

    fn add(&mut self, name: &str, text: &str) -> Result<()> {
        let file: Layer = toml::from_str(text)?;
        if file.cgroup.is_some() {
            bail!("`cgroup` belongs in a [[policy]] table; top-level keys apply to the root cgroup");
        }
        let tables = file.policy.clone().unwrap_or_default();
        if file.keys().is_empty() && tables.is_empty() {
            bail!("the file sets no policy key (an empty policy is almost certainly a mistake)");
        }
        let root = file.over(&self.root).validated().context("the top-level (root cgroup) policy")?;
        let mut seen: Vec<&str> = Vec::new();
        let mut rules = Vec::new();
        for t in &tables {
            let Some(cgroup) = t.cgroup.as_deref() else {
                bail!("a [[policy]] table needs `cgroup = \"/path\"` (globs: * within a name, ** for any depth)");
            };
            let at = match line_of(text, cgroup) {
                Some(n) => format!("line {n}: [[policy]] cgroup = {cgroup:?}"),
                None => format!("[[policy]] cgroup = {cgroup:?}"),
            };
            if seen.contains(&cgroup) {
                bail!("{at}: the same cgroup pattern twice in one file; merge the two tables");
            }
            seen.push(cgroup);
            if t.policy.is_some() {
                bail!("{at}: [[policy]] tables do not nest");
            }
            if let Some(k) = t.keys().into_iter().find(|k| DEVICE_WIDE.contains(k)) {
                bail!("{at}: `{k}` applies to a whole device; set it at the top of the file (root policy)");
            }
            if t.keys().is_empty() {
                bail!("{at}: the table sets no policy key");
            }
            let pattern = Pattern::parse(cgroup).with_context(|| at.clone())?;
            t.over(&root).validated().with_context(|| at.clone())?;
            rules.push(Rule { pattern, layer: t.clone(), source: name.to_owned() });
        }
        self.root = root;
        self.rules.extend(rules);
        self.sources.push(name.to_owned());
        Ok(())
    }

    /// The set a daemon that observes everywhere applies (`--observe`, or
    /// a root policy at mode "observe"): every cgroup's acting mode
    /// observes, "off" stays off.  `forced`: --observe; otherwise only a
    /// root policy at "observe" makes the whole daemon observe.
    pub fn observing(mut self, forced: bool) -> Self {
        if !forced && self.root.mode != Mode::Observe {
            return self;
        }
        self.root.mode = self.root.mode.observing();
        for r in &mut self.rules {
            r.layer.mode = r.layer.mode.map(Mode::observing);
        }
        if forced {
            self.sources.push("(--observe)".into());
        }
        self.observe_all = true;
        self
    }

    /// Whether the whole daemon observes (see `observing`): nothing it
    /// does changes writeback or a knob.
    pub fn observes(&self) -> bool {
        self.observe_all
    }

    /// The policy for writers in the root cgroup, and the device-wide keys.
    pub fn root(&self) -> &Policy {
        &self.root
    }

    /// The effective policy of the cgroup at `path` ("/", "/a/b").
    pub fn resolve(&self, path: &str) -> Policy {
        let at = path.split('/').filter(|c| !c.is_empty()).fold(self.cursor(), |at, c| self.descend(&at, c));
        at.policy
    }

    /// The root cgroup "/", where a walk of the cgroup tree starts.
    pub fn cursor(&self) -> Cursor {
        let states = self.rules.iter().map(|r| r.pattern.start()).collect();
        self.settle(states, self.root.clone())
    }

    /// The child cgroup `name` of the cgroup at `parent`: one NFA step per
    /// rule, so a walk costs the same per cgroup however deep it is.
    pub fn descend(&self, parent: &Cursor, name: &str) -> Cursor {
        let states = self.rules.iter().zip(&parent.states).map(|(r, s)| r.pattern.step(s, name)).collect();
        self.settle(states, parent.policy.clone())
    }

    /// The cursor of a cgroup whose rules stand at `states` and whose
    /// parent's policy is `inherited`: the most specific matching rule (the
    /// later among equals) over it.
    fn settle(&self, states: Vec<States>, inherited: Policy) -> Cursor {
        let best = self
            .rules
            .iter()
            .zip(&states)
            .filter(|(r, s)| r.pattern.accepts(s))
            .max_by_key(|(r, _)| r.pattern.specificity())
            .map(|(r, _)| r);
        let mut policy = inherited;
        // A combination that fails validation (say a min_window above an
        // inherited max_window) keeps the parent's.
        if let Some(Ok(p)) = best.map(|r| r.layer.over(&policy).validated()) {
            policy = p;
        }
        let below = self.rules.iter().zip(&states).any(|(r, s)| r.pattern.may_match_below(s));
        Cursor { states, policy, below }
    }

    /// What --check-policy prints: the sources, then the effective policy
    /// of the root and of each pattern (as if a cgroup of that name existed).
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "sources, in order: {}", self.sources.join(", "));
        let _ = writeln!(out, "\n/ (root: every cgroup not matched below)\n{}", show(&self.root));
        for r in &self.rules {
            let example = r.pattern.example();
            let _ = writeln!(
                out,
                "\n{} (from {}; shown for {example})\n{}",
                r.pattern.text,
                r.source,
                show(&self.resolve(&example))
            );
        }
        out
    }
}

/// Where a walk down the cgroup tree stands: each rule's match states and
/// the cgroup's effective policy.
#[derive(Debug, Clone)]
pub struct Cursor {
    states: Vec<States>,
    policy: Policy,
    below: bool,
}

impl Cursor {
    /// The effective policy of the cgroup.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Whether a rule could match a cgroup below this one.  When none can,
    /// every descendant inherits this cgroup's policy.
    pub fn may_match_below(&self) -> bool {
        self.below
    }
}

/// The line (1-based) where a table's `cgroup = "..."` is, for messages
/// about checks made after parsing.
fn line_of(text: &str, cgroup: &str) -> Option<usize> {
    text.lines().position(|l| l.trim_start().starts_with("cgroup") && l.contains(cgroup)).map(|i| i + 1)
}

fn show(p: &Policy) -> String {
    p.lines().iter().map(|(k, v)| format!("  {k} = {v}")).collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Mode, Size, Window};

    fn set(files: &[&str]) -> Result<PolicySet> {
        let texts: Vec<(String, String)> =
            files.iter().enumerate().map(|(i, t)| (format!("{i}.toml"), t.to_string())).collect();
        PolicySet::from_texts(&texts)
    }

    fn err(files: &[&str]) -> String {
        format!("{:#}", set(files).unwrap_err())
    }

    #[test]
    fn globs() {
        let p = |s: &str| Pattern::parse(s).unwrap();
        let m = |pat: &str, path: &str| {
            let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
            p(pat).matches(&parts)
        };
        assert!(m("/system.slice/backup.service", "/system.slice/backup.service"));
        assert!(!m("/system.slice/backup.service", "/system.slice"));
        assert!(m("/user.slice/**", "/user.slice"));
        assert!(m("/user.slice/**", "/user.slice/user-1000.slice/session-2.scope"));
        assert!(m("/user.slice/user-*.slice", "/user.slice/user-1000.slice"));
        assert!(!m("/user.slice/user-*.slice", "/user.slice/user-1000.slice/x"));
        assert!(m("/**/db.service", "/a/b/db.service"));
        assert!(m("/", "/"));
        assert!(p("/a/b").specificity() > p("/a/*").specificity());
        assert!(p("/a/*").specificity() > p("/a/**").specificity());
    }

    #[test]
    fn a_root_that_observes_makes_every_acting_cgroup_observe() {
        let files = r#"
            [[policy]]
            cgroup = "/system.slice/backup.service"
            mode = "sequential"
            [[policy]]
            cgroup = "/system.slice/postgresql.service"
            mode = "off"
            [[policy]]
            cgroup = "/user.slice/**"
            mode = "observe"
        "#;
        // Root acting: only the cgroup that says so observes.
        let s = set(&[files]).unwrap().observing(false);
        assert!(!s.observes());
        assert_eq!(s.resolve("/user.slice/u").mode, Mode::Observe);
        assert_eq!(s.resolve("/system.slice/backup.service").mode, Mode::Sequential);
        assert_eq!(s.resolve("/").to_bpf().mode, crate::abi::wb_mode_WB_MODE_SEQUENTIAL as u8);
        // The root at observe, or --observe: nothing acts, off stays off.
        for s in [set(&["mode = \"observe\"", files]).unwrap().observing(false), set(&[files]).unwrap().observing(true)]
        {
            assert!(s.observes());
            assert_eq!(s.resolve("/system.slice/backup.service").mode, Mode::Observe);
            assert_eq!(s.resolve("/system.slice/postgresql.service").mode, Mode::Off);
            assert_eq!(s.resolve("/a").to_bpf().mode, crate::abi::wb_mode_WB_MODE_OBSERVE as u8);
        }
        assert_eq!(set(&[files]).unwrap().observing(true).sources.last().unwrap(), "(--observe)");
        // --observe over a root at off: the daemon observes all the same.
        let off = set(&["mode = \"off\"", files]).unwrap().observing(true);
        assert!(off.observes() && off.root().mode == Mode::Off);
        assert!(err(&["mode = \"watch\""]).contains("unknown variant"));
    }

    #[test]
    fn most_specific_wins_and_inherits_from_the_parent() {
        let s = set(&[r#"
            burst = "8MiB"
            [[policy]]
            cgroup = "/system.slice/**"
            window = "32MiB"
            [[policy]]
            cgroup = "/system.slice/postgresql.service"
            mode = "off"
        "#])
        .unwrap();
        assert_eq!(s.root().burst, Size(8 << 20));
        let db = s.resolve("/system.slice/postgresql.service");
        assert_eq!(db.mode, Mode::Off);
        assert_eq!(db.window, Window::Fixed(Size(32 << 20)), "from the parent's match");
        assert_eq!(db.burst, Size(8 << 20), "from the root");
        let other = s.resolve("/system.slice/cron.service");
        assert_eq!(other.mode, Mode::Sequential);
        assert_eq!(other.window, Window::Fixed(Size(32 << 20)));
        assert_eq!(s.resolve("/user.slice"), *s.root());
    }

    #[test]
    fn later_files_win() {
        let s =
            set(&["[[policy]]\ncgroup = \"/a\"\nmode = \"off\"\n", "[[policy]]\ncgroup = \"/a\"\nmode = \"append\"\n"])
                .unwrap();
        assert_eq!(s.resolve("/a").mode, Mode::Append);
        assert_eq!(s.sources.len(), 3);
    }

    #[test]
    fn bad_files_say_what_and_where() {
        assert!(err(&[""]).contains("sets no policy key"));
        assert!(err(&["windw = 1"]).contains("unknown field `windw`"));
        assert!(err(&["windw = 1"]).contains("line 1, column 1"), "{}", err(&["windw = 1"]));
        assert!(err(&["burst = -5"]).contains("must not be negative"));
        assert!(err(&["mode = \"fast\""]).contains("unknown variant `fast`"));
        assert!(err(&["window = 5.5"]).contains("or \"auto\""), "{}", err(&["window = 5.5"]));
        assert!(err(&["cgroup = \"/a\""]).contains("belongs in a [[policy]] table"));
        assert!(err(&["[[policy]]\nmode = \"off\""]).contains("needs `cgroup"));
        assert!(err(&["[[policy]]\ncgroup = \"a\"\nmode = \"off\""]).contains("absolute path"));
        assert!(err(&["[[policy]]\ncgroup = \"/a**\"\nmode = \"off\""]).contains("whole path component"));
        let twice = "[[policy]]\ncgroup = \"/a\"\nmode = \"off\"\n[[policy]]\ncgroup = \"/a\"\nburst = 1\n";
        assert!(err(&[twice]).contains("the same cgroup pattern twice"));
        let device = "[[policy]]\ncgroup = \"/a\"\npacing = false\n";
        assert!(err(&[device]).contains("applies to a whole device"));
        assert!(err(&[device]).contains("0.toml: line 2: [[policy]] cgroup = \"/a\": `pacing`"), "{}", err(&[device]));
        let bounds = "[[policy]]\ncgroup = \"/a\"\nmin_window = \"1GiB\"\n";
        assert!(err(&[bounds]).contains("larger than max_window"));
        assert!(err(&["\u{0}\u{1}garbage"]).contains("0.toml"));
    }

    #[test]
    fn shipped_examples_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/examples");
        let files = dir_files(&dir).unwrap();
        assert!(files.len() >= 3, "{files:?}");
        for f in &files {
            PolicySet::load(std::slice::from_ref(f)).unwrap_or_else(|e| panic!("{}: {e:#}", f.display()));
        }
        let all = PolicySet::load(&files).unwrap();
        assert_eq!(all.resolve("/system.slice/postgresql.service").mode, Mode::Off);
        assert!(all.describe().contains("/system.slice/backup.service"));
    }

    /// The parser never panics, whatever it is given (a small fuzz loop;
    /// `cargo xtask` runs it with the unit tests).
    #[test]
    fn never_panics_on_garbage() {
        let pieces = [
            "window",
            "=",
            "\"16MiB\"",
            "[[policy]]",
            "cgroup",
            "\"/a/**\"",
            "\n",
            "-1",
            "1e999",
            "\"auto\"",
            "[",
            "]",
            "{",
            "}",
            "mode",
            "\"off\"",
            "\u{fffd}",
            "burst",
            "18446744073709551616",
            "\"99999999TiB\"",
            "on_battery",
            ",",
            "'",
            "\"",
            "#",
            "window_seconds",
            "nan",
            "inf",
            "0",
            "[policy]",
        ];
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for _ in 0..20_000 {
            let mut text = String::new();
            for _ in 0..(x % 12) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                text += pieces[(x % pieces.len() as u64) as usize];
                text += if x & 1 == 0 { " " } else { "\n" };
            }
            x = x.wrapping_add(1);
            let _ = set(&[&text]);
        }
    }
}
