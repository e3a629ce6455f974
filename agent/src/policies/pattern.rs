//! Cgroup path patterns, matched without backtracking.
//!
//! Cgroup paths are chosen by whoever may create cgroups, which includes
//! every user systemd delegates a subtree to.  A backtracking matcher costs
//! exponential time on patterns like `*a*a*a*b` or `/**/**/**/x` against a
//! long name or a deep path (the unit tests show it), so components are
//! matched as an NFA over pattern positions (a set of states per rule, one
//! step per path component) and each component with the greedy two-pointer
//! `*` algorithm: O(|pattern| · |path|) at worst.  The walk of the cgroup
//! tree keeps the states per directory ([`States::step`]), so resolving a
//! cgroup costs one step per rule, not a match of its whole path.

use anyhow::{Result, bail};

/// A cgroup path pattern: components, `*` within a component matches any
/// characters but '/', a `**` component matches any number of components.
#[derive(Debug, Clone)]
pub(super) struct Pattern {
    pub(super) text: String,
    parts: Vec<String>,
}

/// The pattern positions a path matched so far can be at (sorted, no
/// duplicates; position `parts.len()` means the whole pattern matched).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct States(Vec<usize>);

impl Pattern {
    pub(super) fn parse(s: &str) -> Result<Self> {
        if !s.starts_with('/') {
            bail!("a cgroup pattern is an absolute path like \"/system.slice/backup.service\", got {s:?}");
        }
        let parts: Vec<String> = s.split('/').filter(|c| !c.is_empty()).map(str::to_owned).collect();
        if let Some(bad) = parts.iter().find(|p| p.contains("**") && p.as_str() != "**") {
            bail!("`**` must be a whole path component (\"/user.slice/**\"), got {bad:?} in {s:?}");
        }
        if let Some(bad) = parts.iter().find(|p| *p == "." || *p == "..") {
            bail!("{bad:?} is not allowed in a cgroup pattern ({s:?})");
        }
        Ok(Self { text: s.to_owned(), parts })
    }

    /// The states of the root cgroup "/" (no component consumed yet).
    pub(super) fn start(&self) -> States {
        self.closure(vec![0])
    }

    /// The states after one more path component.
    pub(super) fn step(&self, from: &States, component: &str) -> States {
        let mut next = Vec::new();
        for &i in &from.0 {
            match self.parts.get(i) {
                None => {}
                // `**` may swallow this component and more.
                Some(p) if p == "**" => next.push(i),
                Some(p) if glob(p.as_bytes(), component.as_bytes()) => next.push(i + 1),
                Some(_) => {}
            }
        }
        self.closure(next)
    }

    /// Whether the path that led to `states` matches the whole pattern.
    pub(super) fn accepts(&self, states: &States) -> bool {
        states.0.last() == Some(&self.parts.len())
    }

    /// Whether some longer path (one component or more below) could match:
    /// a walk of the cgroup tree need not descend where no pattern can.
    pub(super) fn may_match_below(&self, states: &States) -> bool {
        states.0.first().is_some_and(|&i| i < self.parts.len())
    }

    /// Adds the positions after `**` components (they match zero components).
    fn closure(&self, mut states: Vec<usize>) -> States {
        let mut k = 0;
        while k < states.len() {
            let i = states[k];
            if self.parts.get(i).is_some_and(|p| p == "**") {
                states.push(i + 1);
            }
            k += 1;
        }
        states.sort_unstable();
        states.dedup();
        States(states)
    }

    #[cfg(test)]
    pub(super) fn matches(&self, path: &[&str]) -> bool {
        let end = path.iter().fold(self.start(), |s, c| self.step(&s, c));
        self.accepts(&end)
    }

    /// More literal components first, then fewer wildcards.
    pub(super) fn specificity(&self) -> (usize, isize) {
        let literal = self.parts.iter().filter(|p| !p.contains('*')).count();
        let wild =
            self.parts.iter().map(|p| if p == "**" { 2 } else { p.matches('*').count() as isize }).sum::<isize>();
        (literal, -wild)
    }

    /// A cgroup path this pattern matches, for --check-policy.
    pub(super) fn example(&self) -> String {
        let parts: Vec<String> = self.parts.iter().filter(|p| *p != "**").map(|p| p.replace('*', "x")).collect();
        format!("/{}", parts.join("/"))
    }
}

/// `*` matches any run of bytes within one component.  Greedy with one
/// back-up point (the last `*`): a later `*` makes backing up past an
/// earlier one pointless, so this is O(|pat| · |s|) at worst.  Bytes, not
/// chars: a literal after a `*` starts with a leading byte, so it can only
/// match at a character boundary.
fn glob(pat: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0, 0);
    // The last `*` seen and where in `s` its match currently ends.
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        if p < pat.len() && pat[p] == b'*' {
            star = Some((p, i));
            p += 1;
        } else if p < pat.len() && pat[p] == s[i] {
            p += 1;
            i += 1;
        } else if let Some((sp, si)) = star {
            // Let that `*` swallow one more byte and retry what follows it.
            star = Some((sp, si + 1));
            p = sp + 1;
            i = si + 1;
        } else {
            return false;
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn m(pat: &str, path: &str) -> bool {
        let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        Pattern::parse(pat).unwrap().matches(&parts)
    }

    #[test]
    fn globs_within_a_component() {
        for (pat, s, want) in [
            ("abc", "abc", true),
            ("abc", "abd", false),
            ("", "", true),
            ("*", "", true),
            ("*", "anything", true),
            ("a*", "a", true),
            ("*c", "abc", true),
            ("*c", "abcd", false),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXcYYb", false),
            ("user-*.slice", "user-1000.slice", true),
            ("user-*.slice", "user-1000.slice.x", false),
            ("*a*a*b", "aaab", true),
            ("*a*a*b", "aaba", false),
            ("é*ü", "éxxü", true),
            ("*ü", "üü", true),
        ] {
            assert_eq!(glob(pat.as_bytes(), s.as_bytes()), want, "{pat:?} vs {s:?}");
        }
    }

    #[test]
    fn states_say_what_may_match_below() {
        let p = Pattern::parse("/user.slice/*/app.slice/**").unwrap();
        let at = |path: &[&str]| path.iter().fold(p.start(), |s, c| p.step(&s, c));
        assert!(p.may_match_below(&at(&[])));
        assert!(p.may_match_below(&at(&["user.slice", "user-1000.slice"])));
        assert!(!p.may_match_below(&at(&["system.slice"])), "no pattern reaches below /system.slice");
        assert!(p.accepts(&at(&["user.slice", "u", "app.slice"])));
        assert!(p.may_match_below(&at(&["user.slice", "u", "app.slice", "x"])));
        let exact = Pattern::parse("/system.slice/db.service").unwrap();
        let db = ["system.slice", "db.service"].iter().fold(exact.start(), |s, c| exact.step(&s, c));
        assert!(exact.accepts(&db) && !exact.may_match_below(&db));
    }

    /// Patterns and paths a backtracking matcher takes for ever on.  The
    /// previous recursive matcher took 16 s for `*a` × 8 then `b` against
    /// 50 `a`s, and as long for `/**` × 8 then `/b` against 50 components;
    /// neither finished within a minute at 100 (it grows as n^8).
    #[test]
    fn pathological_patterns_take_linear_time() {
        let long = "a".repeat(4000);
        let deep = vec!["a"; 200].join("/");
        let t = Instant::now();
        assert!(!glob(b"*a*a*a*a*a*a*a*a*b", long.as_bytes()));
        assert!(glob(b"*a*a*a*a*a*a*a*a*a", long.as_bytes()));
        assert!(!m("/**/**/**/**/**/**/**/**/b", &format!("/{deep}")));
        assert!(m("/**/**/**/**/**/**/**/**/a", &format!("/{deep}")));
        assert!(!m(&format!("/{}b", "*a".repeat(20)), &format!("/{long}")));
        let took = t.elapsed();
        assert!(took < Duration::from_millis(100), "took {took:?}");
    }

    #[test]
    fn multibyte_names() {
        assert!(m("/ü*/**", "/üx/ä/ö"));
        assert!(!m("/ü*", "/xü"));
    }
}
