//! How many device records a user may hold (a pure decision; mod.rs
//! applies it).  Every FUSE mount is a device, and a user makes them at
//! will (fusermount3, or a mount namespace of their own): each took a
//! record and an entry of BPF's `devices` map (WB_DEVICES_MAX, 1,024) for
//! DEVICE_IDLE after its last write, and a device first seen once the map
//! was full got no entry, so default windows: the administrator's disks
//! too.  Now each user holds at most PER_USER records, all users together
//! ALL_USERS, and a user's device no event named for USER_IDLE is
//! forgotten.  A user's device beyond that gets no record: its writers are
//! left to the kernel (counted as devices_shed_user), unless one of the
//! user's records has been idle for EVICT_IDLE, which is forgotten for it.
//! The administrator's devices are never counted, never shed.

use std::time::{Duration, Instant};

use crate::backing::{Backing, owner};

/// Records one user may hold at once.  A user writes to a few devices of
/// their own at a time (a phone's MTP mount, sshfs, an image); 32 leaves
/// room for that, and 32 users at their bound fill only ALL_USERS.
pub(super) const PER_USER: usize = 32;

/// Records all users' devices may hold together: half of BPF's map, so
/// that the administrator's devices always find an entry.
pub(super) const ALL_USERS: usize = crate::abi::WB_DEVICES_MAX as usize / 2;

/// A user's record no event named for this long makes room for a new
/// device of theirs (when it is not paced and no flusher thread holds it).
pub(super) const EVICT_IDLE: Duration = Duration::from_secs(10);

/// A user's device no event named for this long is forgotten (the
/// administrator's after DEVICE_IDLE): what it learnt of a device the user
/// sets the speed of is worth little.
pub(super) const USER_IDLE: Duration = Duration::from_secs(60);

/// Whose device a record counts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Holder {
    /// The administrator's: disks, sticks, root's network and FUSE mounts.
    Admin,
    /// A user's of this uid (their FUSE server, a loop device over their
    /// file).
    User(u32),
    /// A user's, but whose is not known: a mount in someone's namespace, a
    /// file whose owner could not be told.  All of them share one bound.
    Unknown,
    /// A layered device (loop, dm, md) whose owner lookup has not answered
    /// (owners.rs): counted as Unknown, but never shed itself, since it
    /// may be root's (a loop device over a file not in the dentry cache),
    /// and only privileged paths (losetup, udisks) make block devices.
    Pending,
}

impl Holder {
    pub(super) fn of(backing: Backing) -> Self {
        match backing {
            Backing::Disk | Backing::Network | Backing::Smb | Backing::Fuse { user: 0 } => Self::Admin,
            Backing::Fuse { user } | Backing::UserLoop { user } if user != owner::UNKNOWN && user != u32::MAX => {
                Self::User(user)
            }
            Backing::Layered { .. } => Self::Pending,
            // autofs -hosts: whoever named the host is not known.
            Backing::Fuse { .. } | Backing::UserLoop { .. } | Backing::Unlisted | Backing::UserNetwork => Self::Unknown,
        }
    }

    /// Whose bound its record counts in.
    fn counts_as(self) -> Self {
        if self == Self::Pending { Self::Unknown } else { self }
    }

    /// After how long without an event its record is forgotten.
    pub(super) fn idle(self, admin_idle: Duration) -> Duration {
        if self == Self::Admin { admin_idle } else { USER_IDLE }
    }
}

/// One record held, as the decision sees it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Held<'a> {
    pub bdi: &'a str,
    pub holder: Holder,
    pub last_event: Instant,
    /// Not paced, and no flusher thread or lookup holds it.
    pub idle_ok: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Room<'a> {
    /// A record for it.
    Admit,
    /// A record for it once this one is forgotten.
    Evict(&'a str),
    /// No record: its writers are left to the kernel.
    Shed,
}

/// Whether a device of `new`'s, not known yet, gets a record among `held`
/// at `now`.
pub(super) fn room<'a>(new: Holder, held: &[Held<'a>], now: Instant) -> Room<'a> {
    if new == Holder::Admin || new == Holder::Pending {
        return Room::Admit;
    }
    let users = held.iter().filter(|h| h.holder != Holder::Admin);
    let mine = users.clone().filter(|h| h.holder.counts_as() == new).count();
    let all = users.clone().count();
    if mine < PER_USER && all < ALL_USERS {
        return Room::Admit;
    }
    // The user's own idle record; where all users together are at their
    // bound and this one is not, any user's.
    let own = mine >= PER_USER;
    users
        .filter(|h| !own || h.holder.counts_as() == new)
        .filter(|h| h.idle_ok && now.saturating_duration_since(h.last_event) >= EVICT_IDLE)
        .min_by_key(|h| h.last_event)
        .map_or(Room::Shed, |h| Room::Evict(h.bdi))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(n: usize, holder: Holder, at: Instant) -> Vec<(String, Holder, Instant)> {
        (0..n).map(|i| (format!("{holder:?}-{i}"), holder, at)).collect()
    }

    fn view(v: &[(String, Holder, Instant)]) -> Vec<Held<'_>> {
        v.iter().map(|(bdi, holder, at)| Held { bdi, holder: *holder, last_event: *at, idle_ok: true }).collect()
    }

    #[test]
    fn holders_follow_the_backing() {
        assert_eq!(Holder::of(Backing::Disk), Holder::Admin);
        assert_eq!(Holder::of(Backing::Smb), Holder::Admin);
        assert_eq!(Holder::of(Backing::Network), Holder::Admin);
        assert_eq!(Holder::of(Backing::Fuse { user: 0 }), Holder::Admin, "ntfs-3g from udisks");
        assert_eq!(Holder::of(Backing::Fuse { user: 65534 }), Holder::User(65534));
        assert_eq!(Holder::of(Backing::UserLoop { user: 1000 }), Holder::User(1000));
        assert_eq!(Holder::of(Backing::UserLoop { user: owner::UNKNOWN }), Holder::Unknown);
        assert_eq!(Holder::of(Backing::Fuse { user: u32::MAX }), Holder::Unknown);
        assert_eq!(Holder::of(Backing::Unlisted), Holder::Unknown);
        assert_eq!(Holder::of(Backing::Layered { fuse: false }), Holder::Pending, "until its lookup answers");
        assert_eq!(Holder::Pending.idle(Duration::from_secs(600)), USER_IDLE);
        assert_eq!(Holder::Admin.idle(Duration::from_secs(600)), Duration::from_secs(600));
        assert_eq!(Holder::User(1).idle(Duration::from_secs(600)), USER_IDLE);
        assert_eq!(Holder::Unknown.idle(Duration::from_secs(600)), USER_IDLE);
    }

    /// A user at their bound with every record in use: shed; the
    /// administrator's device still gets one, and so does another user's.
    #[test]
    fn a_user_at_the_bound_is_shed_and_others_are_not() {
        let now = Instant::now();
        let mut v = held(PER_USER, Holder::User(65534), now);
        v.extend(held(3, Holder::Admin, now));
        assert_eq!(room(Holder::User(65534), &view(&v), now), Room::Shed);
        assert_eq!(room(Holder::Admin, &view(&v), now), Room::Admit);
        assert_eq!(room(Holder::User(1000), &view(&v), now), Room::Admit);
        assert_eq!(room(Holder::Unknown, &view(&v), now), Room::Admit);
        let v = held(PER_USER - 1, Holder::User(65534), now);
        assert_eq!(room(Holder::User(65534), &view(&v), now), Room::Admit, "one below the bound");
        let v = held(PER_USER, Holder::Unknown, now);
        assert_eq!(room(Holder::Unknown, &view(&v), now), Room::Shed, "the unknown share one bound");
        assert_eq!(room(Holder::Admin, &[], now), Room::Admit);
        assert_eq!(room(Holder::Pending, &view(&v), now), Room::Admit, "perhaps root's: its lookup decides");
        let v = held(PER_USER, Holder::Pending, now);
        assert_eq!(room(Holder::Unknown, &view(&v), now), Room::Shed, "pending lookups count as unknown");
        assert_eq!(room(Holder::User(3), &view(&v), now), Room::Admit);
        let v = held(5000, Holder::Admin, now);
        assert_eq!(room(Holder::Admin, &view(&v), now), Room::Admit, "the administrator's are never counted");
    }

    /// At the bound, the user's least recently written record idle for
    /// EVICT_IDLE, not paced nor held by a thread, makes room.
    #[test]
    fn the_users_least_recently_written_idle_record_makes_room() {
        let now = Instant::now() + Duration::from_secs(100);
        let mut v = held(PER_USER, Holder::User(7), now);
        v[3].2 = now - EVICT_IDLE - Duration::from_secs(5);
        v[9].2 = now - EVICT_IDLE - Duration::from_secs(1);
        v[12].2 = now - EVICT_IDLE + Duration::from_secs(1);
        v.extend(held(2, Holder::Admin, now - Duration::from_secs(90)));
        v.extend(held(2, Holder::User(8), now - Duration::from_secs(90)));
        let mut h = view(&v);
        assert_eq!(room(Holder::User(7), &h, now), Room::Evict("User(7)-3"), "never another's, nor root's");
        h[3].idle_ok = false;
        assert_eq!(room(Holder::User(7), &h, now), Room::Evict("User(7)-9"), "one paced or in use stays");
        h[9].idle_ok = false;
        assert_eq!(room(Holder::User(7), &h, now), Room::Shed, "none idle long enough");
    }

    /// All users together at ALL_USERS: a user below their own bound takes
    /// any user's idle record, never the administrator's.
    #[test]
    fn all_users_together_are_bounded_too() {
        let now = Instant::now() + Duration::from_secs(100);
        let mut v = Vec::new();
        for uid in 0..(ALL_USERS / PER_USER) as u32 {
            v.extend(held(PER_USER, Holder::User(1000 + uid), now));
        }
        v.extend(held(10, Holder::Admin, now - Duration::from_secs(90)));
        assert_eq!(room(Holder::User(5), &view(&v), now), Room::Shed);
        assert_eq!(room(Holder::Admin, &view(&v), now), Room::Admit);
        v[40].2 = now - EVICT_IDLE;
        assert_eq!(room(Holder::User(5), &view(&v), now), Room::Evict(v[40].0.as_str()));
    }
}
