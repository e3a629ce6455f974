//! Whose a kernel uid is, for the per-user share of streams (streams.rs).
//!
//! A user with an /etc/subuid range — what useradd gives every new user on
//! Debian, Ubuntu and Fedora — runs containers whose processes write as any
//! uid of that range.  Keyed on the kernel uid, each of them had a share of
//! its own, and one user took every stream.  Every uid of a range now counts
//! as the range's owner.  An owner named in the file but not in /etc/passwd
//! (a directory service's user) is keyed by its range's first uid: the range
//! is still one user, though apart from the owner's own uid.  No NSS lookup:
//! it could block the intake thread.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

pub const SUBUID: &str = "/etc/subuid";
const PASSWD: &str = "/etc/passwd";
/// useradd adds ranges while the daemon runs: the file's mtime is looked at
/// this often.
const RECHECK: Duration = Duration::from_secs(5);

pub struct Owners {
    path: PathBuf,
    /// (first, last, owner), sorted by first.
    ranges: Vec<(u32, u32, u32)>,
    mtime: Option<SystemTime>,
    checked: Option<Instant>,
}

impl Owners {
    pub fn new(path: &Path) -> Self {
        let mut o = Self { path: path.to_owned(), ranges: Vec::new(), mtime: None, checked: None };
        o.refresh();
        o
    }

    /// Reads the ranges again if the file changed (at most every RECHECK).
    pub fn refresh(&mut self) {
        if self.checked.is_some_and(|t| t.elapsed() < RECHECK) {
            return;
        }
        self.checked = Some(Instant::now());
        let mtime = std::fs::metadata(&self.path).and_then(|m| m.modified()).ok();
        if mtime == self.mtime {
            return;
        }
        self.mtime = mtime;
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        let passwd = std::fs::read_to_string(PASSWD).unwrap_or_default();
        self.ranges = parse(&text, &passwd);
        tracing::debug!(ranges = self.ranges.len(), path = %self.path.display(), "subordinate uid ranges read");
    }

    /// The user `uid` writes for: the owner of its range, or itself.
    pub fn owner(&self, uid: u32) -> u32 {
        let i = self.ranges.partition_point(|r| r.0 <= uid);
        match i.checked_sub(1).map(|i| self.ranges[i]) {
            Some((_, last, owner)) if uid <= last => owner,
            _ => uid,
        }
    }
}

/// subuid(5) lines, "name-or-uid:first:count", to sorted ranges.
fn parse(subuid: &str, passwd: &str) -> Vec<(u32, u32, u32)> {
    let uid_of = |name: &str| {
        passwd.lines().find_map(|l| {
            let mut f = l.split(':');
            (f.next() == Some(name)).then(|| f.nth(1)?.parse::<u32>().ok()).flatten()
        })
    };
    let mut ranges: Vec<(u32, u32, u32)> = subuid
        .lines()
        .filter_map(|l| {
            let mut f = l.trim().split(':');
            let (who, first, count) = (f.next()?, f.next()?.parse::<u32>().ok()?, f.next()?.parse::<u32>().ok()?);
            let last = first.checked_add(count.checked_sub(1)?)?;
            let owner = who.parse::<u32>().ok().or_else(|| uid_of(who)).unwrap_or(first);
            Some((first, last, owner))
        })
        .collect();
    ranges.sort_unstable();
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/bash\n";

    #[test]
    fn a_range_counts_as_its_owner() {
        let o = Owners {
            path: PathBuf::new(),
            ranges: parse("alice:100000:65536\n1001:165536:65536\nldapuser:231072:65536\nbroken:1:x\n", PASSWD),
            mtime: None,
            checked: None,
        };
        assert_eq!(o.owner(100000), 1000);
        assert_eq!(o.owner(165535), 1000);
        assert_eq!(o.owner(165536), 1001, "an owner given by uid");
        assert_eq!(o.owner(231073), 231072, "an owner passwd does not know: the range is one user");
        assert_eq!(o.owner(1000), 1000);
        assert_eq!(o.owner(99999), 99999);
        assert_eq!(o.owner(296608), 296608, "past the last range");
        assert_eq!(o.owner(0), 0);
    }

    #[test]
    fn no_file_no_ranges() {
        let o = Owners::new(Path::new("/nonexistent/subuid"));
        assert_eq!(o.owner(100000), 100000);
    }
}
