//! Who a listener's peer is, for counting its slots: root, a local user
//! (a subordinate uid counted as its owner), or another host.  A TCP
//! peer's uid is asked of the kernel for its one socket (sock_diag's exact
//! lookup: the kernel's own hash lookup, the same cost however many
//! sockets a user opens); /proc/net/tcp, a table of every socket, is read
//! only where sock_diag is not to be had, and then only so far.

use std::{
    collections::HashMap,
    io::BufRead,
    net::{IpAddr, SocketAddr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

/// Whose a slot is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Who {
    Root,
    /// A local user other than root, by its owner's uid: a subordinate
    /// uid (/etc/subuid) counts as the user it was given to.  User(0) is a
    /// uid root was given (a container's), not root.
    User(u32),
    /// A peer on another host (or in another network namespace), by its
    /// address; an IPv6 one by its /64, which one host holds whole.
    Host(IpAddr),
}

/// What a listener's peers may hold: `total` in all; a local user
/// `per_user`, all local users together `users`; a remote host
/// `per_host`, all of them together `hosts`.  What the users and hosts
/// may not take is root's.
#[derive(Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) total: usize,
    pub(crate) per_user: usize,
    pub(crate) users: usize,
    pub(crate) per_host: usize,
    pub(crate) hosts: usize,
}

/// The client slots of one listener, counted per user and per host.
pub(crate) struct Slots {
    limits: Limits,
    held: Mutex<HashMap<Who, usize>>,
}

/// One client's slot, given back when dropped.
pub(crate) struct Slot {
    slots: Arc<Slots>,
    who: Who,
}

impl Slots {
    pub(crate) fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self { limits, held: Mutex::default() })
    }

    pub(crate) fn take(self: &Arc<Self>, who: Who) -> Option<Slot> {
        let l = self.limits;
        let mut held = self.held.lock().unwrap();
        let all: usize = held.values().sum();
        let pool = |host: bool| held.iter().filter(move |(w, _)| matches!(w, Who::Host(_)) == host).map(|(_, n)| n);
        let mine = held.get(&who).copied().unwrap_or(0);
        let free = all < l.total
            && match who {
                Who::Root => true,
                Who::User(_) => mine < l.per_user && pool(false).sum::<usize>() - root(&held) < l.users,
                Who::Host(_) => mine < l.per_host && pool(true).sum::<usize>() < l.hosts,
            };
        if !free {
            return None;
        }
        *held.entry(who).or_default() += 1;
        Some(Slot { slots: self.clone(), who })
    }

    #[cfg(test)]
    pub(crate) fn held(&self, who: Who) -> usize {
        self.held.lock().unwrap().get(&who).copied().unwrap_or(0)
    }
}

fn root(held: &HashMap<Who, usize>) -> usize {
    held.get(&Who::Root).copied().unwrap_or(0)
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock().unwrap();
        if let Some(n) = held.get_mut(&self.who) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.who);
            }
        }
    }
}

/// A local peer by its uid: root, or its owner's user.
pub(crate) fn local(uid: u32, owners: &Arc<SubUids>) -> Who {
    if uid == 0 { Who::Root } else { Who::User(owners.owner(uid)) }
}

/// A remote peer by its host: its address, an IPv6 one's /64.
fn host(ip: IpAddr) -> Who {
    Who::Host(match ip {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        v4 => v4,
    })
}

/// A dual-stack listener sees an IPv4 peer as ::ffff:a.b.c.d.
fn unmapped(a: SocketAddr) -> SocketAddr {
    match a.ip() {
        IpAddr::V6(ip) => ip.to_ipv4_mapped().map_or(a, |v4| SocketAddr::new(v4.into(), a.port())),
        _ => a,
    }
}

/// /proc/net/tcp{,6} read this far at most, where sock_diag is not to be
/// had: a user with 10,000 listening sockets made it 1.5 MB, and the peer
/// may be past them.  A peer not found by then is counted by its address.
const MAX_TABLE: u64 = 256 << 10;

/// How TCP peers are looked up: by sock_diag, unless the kernel (no
/// tcp_diag) or the sandbox (RestrictAddressFamilies without AF_NETLINK)
/// does not have it.
pub(crate) struct Peers {
    diag: bool,
    owners: Arc<SubUids>,
}

impl Peers {
    /// Tries sock_diag once, on the listener's own socket (root's): if the
    /// kernel finds it, it answers for every peer.
    pub(crate) fn new(listening: SocketAddr, owners: Arc<SubUids>) -> Self {
        let probe = match listening.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => {
                SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), listening.port())
            }
            IpAddr::V6(ip) if ip.is_unspecified() => {
                SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), listening.port())
            }
            _ => listening,
        };
        let any = SocketAddr::new(if probe.is_ipv4() { [0u8; 4].into() } else { [0u8; 16].into() }, 0);
        let diag = matches!(diag_uid(probe, any), Ok(Some(_)));
        if !diag {
            tracing::warn!(
                "sock_diag unavailable (no tcp_diag, or AF_NETLINK not allowed): metrics peers looked up in /proc/net/tcp, \
                 its first {} KiB",
                MAX_TABLE >> 10
            );
        }
        Self { diag, owners }
    }

    /// Whose the peer `peer` of our end `me` is.
    pub(crate) fn who(&self, me: SocketAddr, peer: SocketAddr) -> Who {
        let (me, peer) = (unmapped(me), unmapped(peer));
        let looked = if self.diag { diag_uid(peer, me).map_err(|_| ()) } else { Err(()) };
        let uid = match looked {
            Ok(uid) => uid,
            // Only a peer on this host has a line there.
            Err(()) if peer.ip().is_loopback() || peer.ip() == me.ip() => table_uid(me, peer),
            Err(()) => None,
        };
        match uid {
            Some(uid) => local(uid, &self.owners),
            None => host(peer.ip()),
        }
    }
}

/// SOCK_DIAG_BY_FAMILY (linux/sock_diag.h).
const SOCK_DIAG_BY_FAMILY: u16 = 20;

/// The uid owning the TCP socket in this network namespace whose local
/// end is `theirs` and remote end `ours` (a listener: `ours` 0:0), by one
/// exact sock_diag request.  None: there is no such socket (a peer on
/// another host); an error: sock_diag did not answer.
pub(crate) fn diag_uid(theirs: SocketAddr, ours: SocketAddr) -> std::io::Result<Option<u32>> {
    let raw = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, libc::NETLINK_SOCK_DIAG) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // nlmsghdr, then inet_diag_req_v2 with its inet_diag_sockid.
    let mut req = [0u8; 72];
    req[0..4].copy_from_slice(&72u32.to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    req[16] = if theirs.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 } as u8;
    req[17] = libc::IPPROTO_TCP as u8;
    req[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
    let id = &mut req[24..72];
    id[0..2].copy_from_slice(&theirs.port().to_be_bytes());
    id[2..4].copy_from_slice(&ours.port().to_be_bytes());
    let octets = |a: SocketAddr| match a.ip() {
        IpAddr::V4(ip) => ip.octets().to_vec(),
        IpAddr::V6(ip) => ip.octets().to_vec(),
    };
    let (src, dst) = (octets(theirs), octets(ours));
    id[4..4 + src.len()].copy_from_slice(&src);
    id[20..20 + dst.len()].copy_from_slice(&dst);
    // No cookie: INET_DIAG_NOCOOKIE.
    id[40..48].copy_from_slice(&[0xff; 8]);
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as u16;
    let sent = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            req.as_ptr().cast(),
            req.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // The kernel answered while it took the request: nothing to wait for.
    let mut buf = [0u8; 4096];
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let msg = &buf[..n as usize];
    let u32_at = |o: usize| msg.get(o..o + 4).map(|b| u32::from_ne_bytes(b.try_into().unwrap()));
    let kind = msg.get(4..6).map(|b| u16::from_ne_bytes([b[0], b[1]]));
    match kind {
        // inet_diag_msg: its uid 64 bytes in.
        Some(SOCK_DIAG_BY_FAMILY) => Ok(u32_at(16 + 64)),
        Some(t) if t == libc::NLMSG_ERROR as u16 => match u32_at(16).map(|e| -(e as i32)) {
            Some(libc::ENOENT) => Ok(None),
            Some(e) => Err(std::io::Error::from_raw_os_error(e)),
            None => Err(std::io::ErrorKind::InvalidData.into()),
        },
        _ => Err(std::io::ErrorKind::InvalidData.into()),
    }
}

/// The uid of a local TCP peer from /proc/net/tcp{,6} (this network
/// namespace's): the line whose local address is the peer's and remote
/// address ours, within the first MAX_TABLE bytes.
fn table_uid(me: SocketAddr, peer: SocketAddr) -> Option<u32> {
    let table = if peer.is_ipv4() { "/proc/net/tcp" } else { "/proc/net/tcp6" };
    let file = std::fs::File::open(table).ok()?;
    find_uid(std::io::BufReader::new(std::io::Read::take(file, MAX_TABLE)), me, peer)
}

fn find_uid(table: impl BufRead, me: SocketAddr, peer: SocketAddr) -> Option<u32> {
    let hex = |a: SocketAddr| match a.ip() {
        // The kernel prints each 32-bit word of the address in host order.
        IpAddr::V4(ip) => format!("{:08X}:{:04X}", u32::from_ne_bytes(ip.octets()), a.port()),
        IpAddr::V6(ip) => {
            let words: String = ip
                .octets()
                .chunks(4)
                .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
                .collect();
            format!("{words}:{:04X}", a.port())
        }
    };
    let (theirs, ours) = (hex(peer), hex(me));
    table.lines().skip(1).map_while(Result::ok).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1) == Some(&theirs.as_str()) && f.get(2) == Some(&ours.as_str())).then(|| f.get(7)?.parse().ok())?
    })
}

/// /etc/subuid read this far at most.
const MAX_SUBUID: u64 = 4 << 20;
/// How often /etc/subuid is checked for a change, at most.
const RECHECK: Duration = Duration::from_secs(1);

/// A subordinate range: `count` uids from `start`, given to `owner`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    start: u32,
    count: u32,
    owner: u32,
}

/// Who was given which subordinate uids (/etc/subuid), re-read when the
/// file changes (its mtime or size), by a blocking thread: the listeners
/// only read what was read last.
pub(crate) struct SubUids {
    path: PathBuf,
    state: Mutex<Known>,
}

#[derive(Default)]
struct Known {
    /// Sorted by start.
    ranges: Arc<Vec<Range>>,
    /// The file's (mtime, size) when read.
    read: Option<(SystemTime, u64)>,
    checked: Option<Instant>,
    checking: bool,
}

impl SubUids {
    /// Read once now (at start, before anything is served).
    pub(crate) fn load(path: impl Into<PathBuf>) -> Arc<Self> {
        let me = Arc::new(Self { path: path.into(), state: Mutex::default() });
        me.refresh();
        me
    }

    /// The user `uid` counts as: its owner's uid if it is subordinate.
    /// When a recheck is due, one is started on a blocking thread (this
    /// call returns at once, with what was known).
    pub(crate) fn owner(self: &Arc<Self>, uid: u32) -> u32 {
        let ranges = {
            let mut s = self.state.lock().unwrap();
            let due = s.checked.is_none_or(|t| t.elapsed() >= RECHECK);
            if due
                && !s.checking
                && let Ok(rt) = tokio::runtime::Handle::try_current()
            {
                s.checking = true;
                let me = self.clone();
                rt.spawn_blocking(move || me.refresh());
            }
            s.ranges.clone()
        };
        owner_in(&ranges, uid)
    }

    /// Re-reads the file if it changed since it was read.
    fn refresh(&self) {
        let stamp =
            std::fs::metadata(&self.path).ok().map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()));
        let stale = self.state.lock().unwrap().read != stamp;
        let ranges = stale.then(|| {
            let mut text = String::new();
            if let Ok(f) = std::fs::File::open(&self.path) {
                let _ = std::io::Read::read_to_string(&mut std::io::Read::take(f, MAX_SUBUID), &mut text);
            }
            Arc::new(parse(&text, user_id))
        });
        let mut s = self.state.lock().unwrap();
        if let Some(r) = ranges {
            (s.ranges, s.read) = (r, stamp);
        }
        s.checked = Some(Instant::now());
        s.checking = false;
    }
}

/// The user a uid counts as: the owner of the range it is in, else itself.
fn owner_in(ranges: &[Range], uid: u32) -> u32 {
    let i = ranges.partition_point(|r| r.start <= uid);
    match i.checked_sub(1).map(|i| ranges[i]) {
        Some(r) if uid - r.start < r.count => r.owner,
        _ => uid,
    }
}

/// The lines `name:start:count` of /etc/subuid, the name a user's (as
/// `resolve` finds it) or a uid; lines that say neither are passed over.
/// Sorted by start; where ranges overlap, each uid counts as the owner of
/// the last range starting at or before it.
fn parse(text: &str, resolve: impl Fn(&str) -> Option<u32>) -> Vec<Range> {
    let mut ranges: Vec<Range> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.trim().splitn(3, ':');
            let (name, start, count) = (f.next()?, f.next()?.parse().ok()?, f.next()?.parse::<u32>().ok()?);
            let owner = name.parse().ok().or_else(|| resolve(name))?;
            (count > 0).then_some(Range { start, count, owner })
        })
        .collect();
    ranges.sort_by_key(|r| r.start);
    ranges
}

/// A user's uid from its name (getpwnam_r: NSS's users too).
fn user_id(name: &str) -> Option<u32> {
    let name = std::ffi::CString::new(name).ok()?;
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found = std::ptr::null_mut();
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    let rc = unsafe { libc::getpwnam_r(name.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut found) };
    (rc == 0 && !found.is_null()).then_some(pw.pw_uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subordinate_uids_count_as_their_owner() {
        let text = "alice:100000:65536\n# comment\n1001:165536:65536\nbob:x:1\nnobody-here:300000:10\n\
                    carol:200000:0\n";
        let users = |n: &str| match n {
            "alice" => Some(1000),
            _ => None,
        };
        let ranges = parse(text, users);
        assert_eq!(
            ranges,
            [Range { start: 100000, count: 65536, owner: 1000 }, Range { start: 165536, count: 65536, owner: 1001 }]
        );
        for (uid, owner) in
            [(99999, 99999), (100000, 1000), (165535, 1000), (165536, 1001), (231071, 1001), (231072, 231072), (0, 0)]
        {
            assert_eq!(owner_in(&ranges, uid), owner, "uid {uid}");
        }
        assert_eq!(user_id("root"), Some(0));
    }

    #[test]
    fn a_user_holds_its_share_and_a_host_its_own() {
        let l = Limits { total: 64, per_user: 4, users: 24, per_host: 2, hosts: 32 };
        let slots = Slots::new(l);
        let owners = Arc::new(SubUids { path: "/nonexistent".into(), state: Mutex::default() });
        *owners.state.lock().unwrap() = Known {
            ranges: Arc::new(parse("65534:200000:65536\n", |_| None)),
            checked: Some(Instant::now()),
            ..Default::default()
        };
        // One user's 65,536 subordinate uids hold that user's share.
        let mine: Vec<Slot> = (200000..200100).filter_map(|uid| slots.take(local(uid, &owners))).collect();
        assert_eq!(mine.len(), l.per_user);
        assert!(slots.take(local(65534, &owners)).is_none());
        // A root's container's uids are not root.
        assert_eq!(local(0, &owners), Who::Root);
        // Users together stop at their pool; hosts have one of their own.
        let users: Vec<Slot> = (1000..1100).filter_map(|uid| slots.take(Who::User(uid))).collect();
        assert_eq!(mine.len() + users.len(), l.users);
        let one = "192.0.2.1".parse().unwrap();
        let from_one: Vec<Slot> = (0..10).filter_map(|_| slots.take(host(one))).collect();
        assert_eq!(from_one.len(), l.per_host, "one host beyond its share");
        // An IPv6 host is its /64.
        let v6 = |s: &str| host(s.parse().unwrap());
        assert_eq!(v6("2001:db8::1"), v6("2001:db8::ffff:2"));
        let hosts: Vec<Slot> = (0..100u8).filter_map(|i| slots.take(host([198, 51, 100, i].into()))).collect();
        assert_eq!(from_one.len() + hosts.len(), l.hosts);
        // Root has what is left, and no more.
        let root: Vec<Slot> = (0..100).map_while(|_| slots.take(Who::Root)).collect();
        assert_eq!(root.len(), l.total - l.users - l.hosts);
        drop(mine);
        let again = slots.take(local(200001, &owners));
        assert!(again.is_some(), "a slot given back is free again");
        assert_eq!(slots.held(Who::User(65534)), 1);
    }

    /// A TCP connection's far end is found by sock_diag, with its uid.
    #[test]
    fn a_local_peer_is_found_by_its_socket() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, peer) = l.accept().unwrap();
        let me = s.local_addr().unwrap();
        let uid = unsafe { libc::geteuid() };
        match diag_uid(peer, me) {
            Ok(found) => assert_eq!(found, Some(uid)),
            Err(e) => eprintln!("no sock_diag here ({e}): the table only"),
        }
        assert_eq!(table_uid(me, peer), Some(uid));
        // Our own end is not a peer's; nor is a port nobody holds.
        let gone = SocketAddr::new(peer.ip(), 1);
        assert_eq!(diag_uid(gone, me).ok().flatten(), None);
        drop(c);
    }
}
