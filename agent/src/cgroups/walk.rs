//! One walk of the cgroup v2 tree: which cgroups need a policy of their own.
//!
//! Any user systemd delegates a subtree to (user@UID.service, a service
//! with `Delegate=yes` and `User=`) may create cgroups in it, tens of
//! thousands if they like.  What keeps the walk cheap and fair:
//!
//! - It descends only where a policy could differ from the root's: below a
//!   cgroup with the root's policy that no pattern can reach further down,
//!   every cgroup inherits the root policy, so the subtree is skipped.  With
//!   policies for services only, a user's cgroups then cost nothing.
//! - A directory with no child cgroups (st_nlink 2: kernfs counts subdirs)
//!   is not read; a delegated directory whose mtime and st_nlink are those
//!   of the last walk is not read again, its children come from the walk
//!   before.  Only delegated (non-root) directories: kernfs keeps a mtime
//!   only for nodes with attributes of their own.  Measured on 6.18: a
//!   chowned cgroup's mtime moves when a child is made, a root-owned one's
//!   stays put.  Cgroup v2 directories cannot be renamed, so a directory
//!   whose children neither came nor went has the same ones.
//! - Root-owned cgroups are walked first, under the whole budget; each
//!   delegated subtree (a directory owned by another user below one owned
//!   by root) comes after them, under a budget of its own.
//! - Delegated subtrees are walked at most 1% of the time: after a walk of
//!   them that took t, the next waits REST × t (at least the usual second);
//!   meanwhile their last results stand.  Root-owned cgroups (a service
//!   starting) are walked every time.

use std::{
    collections::HashMap,
    ffi::OsString,
    fs::Metadata,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    rc::Rc,
    time::{Duration, Instant},
};

use crate::{
    abi::wb_policy,
    policies::{Cursor, PolicySet},
};

/// A cgroup whose policy is not the root's: it needs a map entry.
#[derive(Clone)]
pub struct Found {
    pub id: u64,
    pub path: String,
    pub policy: wb_policy,
    /// Below a delegation: its path is chosen by an unprivileged user.
    pub delegated: bool,
}

/// What one walk found, root-owned cgroups first.
#[derive(Default)]
pub struct Outcome {
    pub found: Vec<Found>,
    /// Cgroups visited (stat'ed and resolved).
    pub walked: usize,
    /// Directories read (the others came from the walk before or are leaves).
    pub listed: usize,
    /// Delegated subtrees whose budget ran out before they were walked whole.
    pub capped: Vec<String>,
    /// The whole budget ran out: some cgroups were not walked (delegated
    /// subtrees first).
    pub full: bool,
}

/// A directory's child cgroups as last read, and what tells a change.
struct Listing {
    stamp: (i64, i64, u64),
    subdirs: Rc<[OsString]>,
    /// All of them: a listing cut at a budget only serves that budget.
    complete: bool,
}

/// A walk of delegated subtrees that took t is followed by REST × t
/// without one: they cost at most 1% of a core however many there are.
const REST: u32 = 100;

/// Keeps delegated directories' listings from one walk to the next, and
/// what the delegated subtrees held while they rest.
pub struct Walker {
    listings: HashMap<u64, Listing>,
    delegated: Vec<Found>,
    capped: Vec<String>,
    rest_until: Option<Instant>,
    rest: u32,
}

impl Default for Walker {
    fn default() -> Self {
        Self { listings: HashMap::new(), delegated: Vec::new(), capped: Vec::new(), rest_until: None, rest: REST }
    }
}

/// A cgroup reached by the walk, not yet visited.
struct Node {
    dir: PathBuf,
    path: String,
    cursor: Cursor,
    meta: Metadata,
}

enum Descend {
    No,
    Into(Rc<[OsString]>),
    OutOfBudget,
}

/// One walk's state.
struct Pass<'a> {
    set: &'a PolicySet,
    root: wb_policy,
    old: HashMap<u64, Listing>,
    new: HashMap<u64, Listing>,
    out: Outcome,
}

impl Walker {
    /// Walks the hierarchy mounted at `v2`: at most `budget` cgroups in
    /// all, at most `per_delegation` in each delegated subtree.
    pub fn walk(&mut self, v2: &Path, set: &PolicySet, budget: usize, per_delegation: usize) -> Outcome {
        let Ok(meta) = std::fs::symlink_metadata(v2) else { return Outcome::default() };
        let mut pass = Pass {
            set,
            root: set.root().to_bpf(),
            old: std::mem::take(&mut self.listings),
            new: HashMap::new(),
            out: Outcome::default(),
        };
        let mut left = budget;
        let mut delegations = Vec::new();
        let top = Node { dir: v2.to_owned(), path: "/".into(), cursor: set.cursor(), meta };
        pass.out.full = !pass.subtree(top, &mut left, false, &mut delegations);
        let now = Instant::now();
        if self.rest_until.is_some_and(|t| now < t) {
            // Their directories were not visited: keep what was learned.
            pass.new.extend(pass.old.drain());
            let room = left.min(self.delegated.len());
            pass.out.found.extend_from_slice(&self.delegated[..room]);
            pass.out.capped = self.capped.clone();
            pass.out.full |= room < self.delegated.len();
        } else {
            let first = pass.out.found.len();
            for d in delegations {
                if left == 0 {
                    pass.out.full = true;
                    break;
                }
                let path = d.path.clone();
                let mut mine = left.min(per_delegation);
                let before = mine;
                if !pass.subtree(d, &mut mine, true, &mut Vec::new()) {
                    pass.out.capped.push(path);
                }
                left -= before - mine;
            }
            self.delegated = pass.out.found[first..].to_vec();
            self.capped = pass.out.capped.clone();
            let rest = now.elapsed() * self.rest;
            self.rest_until = (rest > Duration::from_secs(1)).then(|| now + rest);
        }
        self.listings = pass.new;
        pass.out
    }

    /// Walk the delegated subtrees next time (the policies changed).
    pub fn wake(&mut self) {
        self.rest_until = None;
    }
}

impl Pass<'_> {
    /// Visits `top` and the cgroups below it while `left` lasts; false if
    /// it ran out first.  Outside delegations, delegated subtrees are put
    /// aside in `later`.  Iterative: a user may nest cgroups thousands deep.
    fn subtree(&mut self, top: Node, left: &mut usize, delegated: bool, later: &mut Vec<Node>) -> bool {
        let mut stack: Vec<(Node, Rc<[OsString]>, usize)> = Vec::new();
        let mut next = Some(top);
        loop {
            if let Some(node) = next.take() {
                if *left == 0 {
                    return false;
                }
                *left -= 1;
                match self.visit(&node, *left, delegated) {
                    Descend::No => {}
                    Descend::Into(children) => stack.push((node, children, 0)),
                    Descend::OutOfBudget => return false,
                }
            }
            let Some((parent, children, i)) = stack.last_mut() else { return true };
            let Some(name) = children.get(*i) else {
                stack.pop();
                continue;
            };
            *i += 1;
            let dir = parent.dir.join(name);
            // Gone since it was listed, or not a cgroup.
            let Ok(meta) = std::fs::symlink_metadata(&dir) else { continue };
            if !meta.is_dir() {
                continue;
            }
            let name = name.to_string_lossy();
            let path = if parent.path == "/" { format!("/{name}") } else { format!("{}/{name}", parent.path) };
            let node = Node { cursor: self.set.descend(&parent.cursor, &name), dir, path, meta };
            if !delegated && parent.meta.uid() == 0 && node.meta.uid() != 0 {
                later.push(node);
            } else {
                next = Some(node);
            }
        }
    }

    /// Records the cgroup's policy; its child cgroups, if the walk must
    /// go below it (at most `left` of them).
    fn visit(&mut self, node: &Node, left: usize, delegated: bool) -> Descend {
        self.out.walked += 1;
        let policy = node.cursor.policy().to_bpf();
        if policy != self.root {
            self.out.found.push(Found { id: node.meta.ino(), path: node.path.clone(), policy, delegated });
        }
        let leaf = node.meta.nlink() == 2;
        let all_inherit_root = policy == self.root && !node.cursor.may_match_below();
        if leaf || all_inherit_root {
            Descend::No
        } else if left == 0 {
            Descend::OutOfBudget
        } else {
            Descend::Into(self.children(node, left))
        }
    }

    fn children(&mut self, node: &Node, left: usize) -> Rc<[OsString]> {
        let m = &node.meta;
        let (id, stamp) = (m.ino(), (m.mtime(), m.mtime_nsec(), m.nlink()));
        let keep = m.uid() != 0;
        if keep
            && let Some(l) = self.old.remove(&id)
            && l.stamp == stamp
            && (l.complete || l.subdirs.len() >= left)
        {
            let subdirs = l.subdirs.clone();
            self.new.insert(id, l);
            return subdirs;
        }
        self.out.listed += 1;
        let mut subdirs = Vec::new();
        let mut complete = true;
        if let Ok(entries) = std::fs::read_dir(&node.dir) {
            for e in entries.flatten() {
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                // Reading a user's 20,000 names to visit 2,000 is waste.
                if subdirs.len() == left {
                    complete = false;
                    break;
                }
                subdirs.push(e.file_name());
            }
        }
        let subdirs: Rc<[OsString]> = subdirs.into();
        if keep {
            self.new.insert(id, Listing { stamp, subdirs: subdirs.clone(), complete });
        }
        subdirs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory tree standing in for the cgroup hierarchy: plain
    /// directories count subdirectories in st_nlink as kernfs does.
    struct Tree(PathBuf);

    impl Tree {
        fn new() -> Self {
            let dir =
                std::env::temp_dir().join(format!("wb-walk-{}-{:?}", std::process::id(), std::thread::current().id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn mkdir(&self, path: &str) -> PathBuf {
            let p = self.0.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(&p).unwrap();
            p
        }

        fn chown(&self, path: &str, uid: u32) {
            let p =
                std::ffi::CString::new(self.0.join(path.trim_start_matches('/')).into_os_string().into_vec()).unwrap();
            assert_eq!(unsafe { libc::chown(p.as_ptr(), uid, uid) }, 0);
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    use std::os::unix::ffi::OsStringExt;

    fn set(text: &str) -> PolicySet {
        PolicySet::from_texts(&[("t.toml".into(), text.into())]).unwrap()
    }

    fn paths(out: &Outcome) -> Vec<&str> {
        out.found.iter().map(|f| f.path.as_str()).collect()
    }

    /// A user's subtree: /user.slice/u, owned by 65534, with `n` children
    /// of one child each.
    fn tree_with_user(n: usize) -> Tree {
        let t = Tree::new();
        t.mkdir("/system.slice/db.service");
        t.mkdir("/system.slice/cron.service");
        t.mkdir("/user.slice/u");
        for i in 0..n {
            t.mkdir(&format!("/user.slice/u/c{i}/leaf"));
        }
        t.chown("/user.slice/u", 65534);
        t
    }

    fn root() -> bool {
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn skips_what_no_pattern_reaches() {
        let t = tree_with_user(50);
        let s = set("[[policy]]\ncgroup = \"/system.slice/db.service\"\nmode = \"off\"\n");
        let out = Walker::default().walk(&t.0, &s, 1000, 1000);
        assert_eq!(paths(&out), ["/system.slice/db.service"]);
        // "/", the two slices and system.slice's two services: nothing below /user.slice.
        assert_eq!(out.walked, 5, "{:?}", out.walked);
    }

    #[test]
    fn services_first_and_a_cap_per_delegation() {
        if !root() {
            return eprintln!("skipped: delegation needs chown (root)");
        }
        let t = tree_with_user(50);
        let s = set("[[policy]]\ncgroup = \"/system.slice/db.service\"\nmode = \"off\"\n\
                     [[policy]]\ncgroup = \"/user.slice/**\"\nburst = \"1MiB\"\n");
        let mut w = Walker::default();
        let out = w.walk(&t.0, &s, 1000, 20);
        assert!(out.found.iter().position(|f| f.path == "/system.slice/db.service").unwrap() < 2);
        let user: Vec<_> = out.found.iter().filter(|f| f.delegated).collect();
        assert_eq!(user.len(), 20, "the delegation's budget");
        assert!(out.found.iter().take_while(|f| !f.delegated).count() == out.found.len() - 20, "root-owned first");
        assert_eq!(out.capped, ["/user.slice/u"]);
        assert!(!out.full);
        // The whole budget spent on root-owned cgroups: the user's wait.
        let out = w.walk(&t.0, &s, 4, 20);
        assert!(out.full && paths(&out).contains(&"/system.slice/db.service"), "{:?}", paths(&out));
    }

    #[test]
    fn unchanged_delegated_directories_are_not_read_again() {
        if !root() {
            return eprintln!("skipped: delegation needs chown (root)");
        }
        let t = tree_with_user(30);
        for i in 0..30 {
            t.chown(&format!("/user.slice/u/c{i}"), 65534);
        }
        let s = set("[[policy]]\ncgroup = \"/user.slice/**\"\nburst = \"1MiB\"\n");
        // Never resting: on a loaded machine (CI building beside the unit
        // tests) a walk of the 31 delegated directories took over 10 ms,
        // which earns a second of rest, and the walk after the mkdir below
        // did not look at them.
        let mut w = Walker { rest: 0, ..Walker::default() };
        let first = w.walk(&t.0, &s, 1000, 1000);
        // Root-owned: "/" and /user.slice (/system.slice is pruned).  Delegated: u and its 30 children.
        assert_eq!(first.listed, 2 + 31);
        assert_eq!(first.found.len(), 1 + 1 + 30 + 30, "{:?}", paths(&first));
        let again = w.walk(&t.0, &s, 1000, 1000);
        assert_eq!(again.listed, 2, "only root-owned directories are read again");
        assert_eq!(again.found.len(), first.found.len());
        // A new cgroup changes its parent's mtime and link count.
        std::thread::sleep(std::time::Duration::from_millis(10));
        t.mkdir("/user.slice/u/c3/new");
        let after = w.walk(&t.0, &s, 1000, 1000);
        assert_eq!(after.listed, 3);
        assert!(paths(&after).contains(&"/user.slice/u/c3/new"));
    }

    #[test]
    fn delegated_subtrees_rest_after_a_costly_walk() {
        if !root() {
            return eprintln!("skipped: delegation needs chown (root)");
        }
        let t = tree_with_user(5);
        let s = set("[[policy]]\ncgroup = \"/user.slice/**\"\nburst = \"1MiB\"\n");
        // Any walk then earns more than a second of rest.
        let mut w = Walker { rest: 1_000_000, ..Walker::default() };
        let first = w.walk(&t.0, &s, 1000, 1000);
        t.mkdir("/user.slice/u/c0/new");
        t.mkdir("/user.slice/new");
        let rested = w.walk(&t.0, &s, 1000, 1000);
        assert!(paths(&rested).contains(&"/user.slice/new"), "root-owned cgroups are walked every time");
        assert!(!paths(&rested).contains(&"/user.slice/u/c0/new"), "{:?}", paths(&rested));
        assert_eq!(rested.found.len(), first.found.len() + 1, "the delegation's last results stand");
        w.wake();
        assert!(paths(&w.walk(&t.0, &s, 1000, 1000)).contains(&"/user.slice/u/c0/new"));
    }
}
