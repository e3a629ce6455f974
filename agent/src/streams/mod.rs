//! The agent's table of active streams: which file each streaming writer is
//! filling, the read-only handle the agent holds on it, and its totals.
//! Owned by the intake task alone, so it needs no lock.  What it keeps of
//! each stream and writer is in `records`; how many streams one user may
//! hold, in `room`; what it reports (status, per-unit totals), in `report`.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

mod records;
mod report;
mod room;
mod would;

use self::{
    records::{Left, Pending, Stream, StreamKey, Writer, closed_file},
    room::room,
    would::Would,
};
use crate::{
    abi::{EventKind, RelPath, wb_event},
    admission::{FLUSH_MEMORY, FlushMemory},
    bandwidth::Active,
    counters::{Counters, ErrorKind},
    devices::{DeviceShared, Devices},
    flusher::{Batch, Flush, Flushers, StreamFile, Target},
    status::printable,
    sys::{self, FileId},
    units::{self, Units},
};

/// A writer's cgroup (from /proc) and the systemd unit it names.
fn unit_of(pid: u32) -> (String, String) {
    let cgroup = units::cgroup_of(pid);
    let unit = units::unit_of(&cgroup).to_owned();
    (cgroup, unit)
}

/// A batch of closed files goes out when it holds a window's worth of data,
/// this many files, or has waited BATCH_AGE.
const BATCH_FILES: usize = 1024;
pub const BATCH_AGE: Duration = Duration::from_millis(100);
/// At most this many of a writer's files left to the kernel are remembered
/// (a flood of tiny files must not grow the agent): the older ones of a
/// run of files smaller than budget / LEFT_FILES may stay dirty for up to
/// dirty_expire after the writer ends.
const LEFT_FILES: usize = 4096;
/// However slow its windows, a stream stops counting as writing after this.
pub(super) const IDLE_MAX: Duration = Duration::from_secs(30);
/// A multi-file writer with no closed file for this long is reported ended
/// (at once when its process has exited).
const WRITER_IDLE: Duration = Duration::from_secs(5);
/// On a device whose writers together count for pacing, a multi-file
/// writer counts while its latest file was closed this recently.
const WRITER_RECENT: Duration = Duration::from_secs(2);
/// How long stopping waits for the flusher threads to hand what is queued
/// to writeback (they skip the waits then; only a hung device takes longer).
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);
/// Streams at most by default (`--max-streams`), each holding its file and
/// the writer's pidfd (main raises RLIMIT_NOFILE above twice this).  Beyond
/// it new streams are left to the kernel, counted as over_cap.
pub const MAX_HELD: usize = 8192;

pub struct StreamTable {
    streams: HashMap<StreamKey, Stream>,
    /// By (device, writer's pid).
    pending: HashMap<(String, u32), Pending>,
    /// By (device, writer's pid).
    left: HashMap<(String, u32), Left>,
    writers: HashMap<u32, Writer>,
    /// Writers of block devices through their node, by (pid, disk's bdi):
    /// one process may write several (`tee image > /dev/sdb > /dev/sdc`).
    nodes: HashMap<(u32, String), Writer>,
    flushers: Flushers,
    devices: Devices,
    counters: Arc<Counters>,
    next_id: u64,
    /// At most this many streams.
    max_held: usize,
    /// The held-files cap was logged (again once the table has drained).
    over_cap_logged: bool,
    /// What waiting flushes hold, in all of `pending`, `left` and the
    /// devices' queues.
    memory: FlushMemory,
    /// Per systemd unit since the start (units.rs).
    units: Units,
    /// When account_units last ran.
    units_ticked: Instant,
}

impl StreamTable {
    pub fn new(counters: Arc<Counters>, devices: Devices, max_held: usize) -> Self {
        Self {
            streams: HashMap::new(),
            pending: HashMap::new(),
            left: HashMap::new(),
            writers: HashMap::new(),
            nodes: HashMap::new(),
            flushers: Flushers::new(counters.clone()),
            devices,
            counters,
            next_id: 0,
            max_held,
            over_cap_logged: false,
            memory: FlushMemory::new(FLUSH_MEMORY),
            units: Units::new(units::MAX_UNITS),
            units_ticked: Instant::now(),
        }
    }

    /// Bytes the flushes waiting in the agent hold (at most FLUSH_MEMORY).
    pub fn flush_memory(&self) -> usize {
        self.memory.used()
    }

    /// Writeback of the event's range of `target` on `dev`, waiting for
    /// nothing; None when the flushes waiting in the agent already hold
    /// FLUSH_MEMORY, or half of it are the writer's user's: the range is
    /// left to the kernel, counted as over_cap.
    fn flush_of(&self, ev: &wb_event, target: Target, dev: &DeviceShared) -> Option<Flush> {
        let user = ev.owner;
        let f = Flush::new(target, dev.flush_start(ev.start), ev.end, user, &self.memory);
        if f.is_none() {
            self.counters.error(ErrorKind::OverCap);
        }
        f
    }

    /// Owners of flush batches: streams count up from 1 << 32, multi-file
    /// writers are their pid (below 1 << 32).
    fn new_stream_id(&mut self) -> u64 {
        self.next_id += 1;
        (1 << 32) + self.next_id
    }

    /// One event; `path` comes with closes on filesystems without file
    /// handles (abi::wb_event::decode_any).
    pub fn handle(&mut self, kind: EventKind, ev: &wb_event, path: Option<RelPath>) {
        self.counters.add(&self.counters.events, 1);
        tracing::debug!(
            kind = ?kind, pid = ev.tgid, fd = ev.fd, ino = ev.ino, start = ev.start, end = ev.end, comm = %printable(&ev.comm()),
            "event"
        );
        let key = StreamKey { tgid: ev.tgid, file: FileId { dev: ev.st_dev(), ino: ev.ino } };
        // A stream held when the policy came to list its device runs on
        // to its close.  The policy first: with leave_devices empty (the
        // default) that is one test, and no lookup in the stream table.
        if self.devices.left_by_policy(ev) && !self.streams.contains_key(&key) {
            self.counters.add(&self.counters.left_by_policy, 1);
            return;
        }
        // A user's device beyond their bound (devices/bound.rs): no record,
        // its writers left to the kernel.
        if !self.devices.admits(ev) && !self.streams.contains_key(&key) {
            return;
        }
        if ev.block_device() {
            return self.block_device(kind, key, ev);
        }
        match kind {
            EventKind::Span => self.span(key, ev),
            EventKind::Close => self.close(key, ev, path),
        }
    }

    /// A writer of a block device through its node (`dd of=/dev/sdb`): its
    /// disk is paced like a streaming writer's, and nothing of the writer
    /// is reached.  The device's last close writes it back, so holding the
    /// writer's open file (pidfd_getfd) to start its windows would make the
    /// agent's close the last one, and the writer's close() would return
    /// before its data were on the device; reopening it through
    /// /proc/<pid>/fd, as a file is reached, would open the node, which
    /// runs its driver and holds the device (sys::reopen_checked refuses
    /// anything but a regular file besides).  Under its cap the kernel's
    /// flusher writes it behind the writer, and the writer's own close
    /// waits for what the cap holds.  Left alone: a device a filesystem is
    /// mounted on, whose writers are served as files.
    fn block_device(&mut self, kind: EventKind, key: StreamKey, ev: &wb_event) {
        let bdi = ev.bdi();
        if bdi.is_empty() {
            return;
        }
        self.devices.note(ev);
        if kind == EventKind::Close || self.devices.mounted_node(&bdi, ev.sb_dev) {
            return;
        }
        let now = Instant::now();
        let bytes = ev.end - ev.start;
        let w = self.nodes.entry((key.tgid, bdi.clone())).or_insert_with(|| {
            let dev = crate::abi::kernel_dev_to_user(ev.sb_dev);
            let dev = format!("{}:{}", libc::major(dev), libc::minor(dev));
            let comm = ev.comm();
            let observe = ev.observed();
            let name = self.devices.name(&bdi);
            let (cgroup, unit) = unit_of(key.tgid);
            tracing::info!(
                pid = key.tgid, comm = %printable(&comm), unit = %printable(&unit), cgroup = %printable(&cgroup),
                %dev, %bdi, %name, observe, "block-device writer started"
            );
            self.units.stream_started(&unit, &cgroup, observe);
            Writer::new(comm, (cgroup, unit), bdi.clone(), now, true, observe)
        });
        w.add(bytes, now);
        let (meaningful, acting) = (w.rate.meaningful(now, self.devices.bandwidth(&bdi)), !w.observe);
        if self.devices.dirtied(&bdi, bytes, now) || meaningful {
            self.devices.busy(&bdi, false, acting);
        }
    }

    /// A close the intake reached late, behind a flood (intake.rs,
    /// SHED_AGE): left to the kernel and counted, unless the agent holds
    /// the file, which it must let go of.  As a close BPF sheds, it is not
    /// noted for its writer or device either: that bookkeeping is what
    /// costs the intake (keeping it and shedding only the flush, the wait
    /// behind a flood was 793-1140 ms, against 691-695 shedding it all and
    /// 1096-1192 shedding nothing).  True if shed.
    pub fn shed_late(&mut self, ev: &wb_event) -> bool {
        let key = StreamKey { tgid: ev.tgid, file: FileId { dev: ev.st_dev(), ino: ev.ino } };
        if self.streams.contains_key(&key) {
            return false;
        }
        self.counters.add(&self.counters.closes_shed_late, 1);
        true
    }

    fn span(&mut self, key: StreamKey, ev: &wb_event) {
        let dev = self.devices.note(ev);
        if !self.streams.contains_key(&key) && !self.start(key, ev, &dev) {
            return;
        }
        let s = self.streams.get_mut(&key).expect("started above");
        let now = Instant::now();
        s.bytes += ev.end - ev.start;
        s.spans += 1;
        s.gap = now - s.last_span;
        s.last_span = now;
        s.last_bytes = ev.end - ev.start;
        // As its policy says now (BPF reads it at each window: a reload).
        s.observe = ev.observed();
        if ev.fd >= 0 {
            s.fd = ev.fd;
        }
        let (id, file, bdi, observe, unit) = (s.id, s.file.clone(), s.bdi.clone(), s.observe, s.unit.clone());
        let counts = s.counts(now, self.devices.quiet(), dev.bandwidth(), false);
        if self.devices.dirtied(&bdi, ev.end - ev.start, now) || counts {
            self.devices.busy(&bdi, false, !observe);
        }
        if !dev.flushes_span_to(ev.end) {
            return;
        }
        if observe {
            return Would::Window { bytes: ev.end - dev.flush_start(ev.start) }.count(&self.counters);
        }
        if let Some(job) = self.flush_of(ev, Target::Held(file), &dev) {
            self.units.written_behind(&unit, job.end - job.start);
            self.flushers.submit(&bdi, &dev, Batch { owner: id, flushes: vec![job] });
        }
    }

    /// Starts a stream for the event's writer and file, if the caps allow;
    /// false when the span was handled otherwise (by handle) or dropped.
    /// Nothing here opens the file: the device's flusher thread does.
    fn start(&mut self, key: StreamKey, ev: &wb_event, dev: &Arc<crate::devices::DeviceShared>) -> bool {
        // fd -1: no descriptor to reach the file through (the fentry
        // backend found none; pages dirtied through a mapping or io_uring).
        // Nothing is held: no cap applies.
        if ev.fd < 0 {
            self.by_handle(key, ev, dev);
            return false;
        }
        let user = ev.owner;
        if let Err(why) = self.room_for(user) {
            self.counters.error(ErrorKind::OverCap);
            if !std::mem::replace(&mut self.over_cap_logged, true) {
                tracing::warn!(max = self.max_held, owner = ev.owner, "{why}: new ones are left to the kernel");
            }
            return false;
        }
        let pidfd = match sys::pidfd_open(key.tgid).map_err(sys::pidfd_error) {
            Ok(pidfd) => pidfd,
            Err(ErrorKind::ProcessGone) => {
                // The writer moved on before the agent got there: reach the
                // inode by handle.
                self.by_handle(key, ev, dev);
                return false;
            }
            Err(kind) => {
                self.counters.error(kind);
                tracing::debug!(pid = key.tgid, fd = ev.fd, error = kind.name(), "span skipped");
                return false;
            }
        };
        let now = Instant::now();
        let (cgroup, unit) = unit_of(key.tgid);
        let stream = Stream {
            id: self.new_stream_id(),
            file: Arc::new(StreamFile::new(key.tgid, ev.fd, pidfd, closed_file(key, ev, None))),
            fd: ev.fd,
            user,
            comm: ev.comm(),
            cgroup,
            unit,
            bdi: ev.bdi(),
            started: now,
            bytes: 0,
            spans: 0,
            last_span: now,
            gap: Duration::ZERO,
            last_bytes: 0,
            observe: ev.observed(),
        };
        tracing::info!(
            pid = key.tgid, owner = ev.owner, comm = %printable(&stream.comm), unit = %printable(&stream.unit),
            cgroup = %printable(&stream.cgroup), fd = ev.fd, ino = key.file.ino, bdi = %stream.bdi,
            name = %self.devices.name(&stream.bdi), observe = stream.observe, "stream started"
        );
        self.units.stream_started(&stream.unit, &stream.cgroup, stream.observe);
        // An observing stream holds the writer's pidfd (to see it exit),
        // never its file: only a flush opens that (flusher::StreamFile).
        let started =
            if stream.observe { &self.counters.would_streams_started } else { &self.counters.streams_started };
        self.counters.add(started, 1);
        self.streams.insert(key, stream);
        true
    }

    /// Whether one more stream of user `user` fits (room).  The user's
    /// streams are counted only from about half the cap: below it, one more
    /// fits even for a user holding every stream.
    fn room_for(&self, user: u32) -> Result<(), &'static str> {
        let held = self.streams.len();
        let mine = match room(held, held, self.max_held) {
            Ok(()) => held,
            Err(_) => self.streams.values().filter(|s| s.user == user).count(),
        };
        room(held, mine, self.max_held)
    }

    /// The writer closed the file: hand its tail to writeback.  A stream's
    /// file is held; any other file is reached by handle (or path), in a batch.
    fn close(&mut self, key: StreamKey, ev: &wb_event, path: Option<RelPath>) {
        let tail = ev.end - ev.start;
        let dev = self.devices.note(ev);
        let now = Instant::now();
        let device_busy = self.devices.dirtied(&ev.bdi(), tail, now);
        if let Some(s) = self.streams.remove(&key) {
            if s.observe {
                // A held file's close is flushed whether or not its device
                // is paced: no would-budget.
                if let Some(w) = Would::close(dev.flush_start(ev.start), ev.end, 0) {
                    w.count(&self.counters);
                }
                self.ended(key, s, tail, "closed");
                return;
            }
            s.file.set_path(path);
            if let Some(job) = self.flush_of(ev, Target::Held(s.file.clone()), &dev) {
                self.units.written_behind(&s.unit, job.end - job.start);
                self.flushers.submit(&s.bdi, &dev, Batch { owner: s.id, flushes: vec![job] });
            }
            self.ended(key, s, tail, "closed");
            return;
        }
        self.note_writer(key.tgid, ev, tail, now);
        self.writer_busy(key.tgid, device_busy);
        if ev.observed() {
            let would = Would::close(dev.flush_start(ev.start), ev.end, self.devices.would_budget(&ev.bdi()));
            return would.into_iter().for_each(|w| w.count(&self.counters));
        }
        let Some(job) = self.flush_of(ev, Target::Closed(closed_file(key, ev, path)), &dev) else {
            return;
        };
        if let Some(w) = self.writers.get(&key.tgid) {
            let unit = w.unit.clone();
            self.units.written_behind(&unit, job.end - job.start);
            self.units.file_flushed(&unit);
        }
        let slot = (ev.bdi(), key.tgid);
        let budget = self.devices.budget(&slot.0);
        if budget != 0 {
            self.counters.add(&self.counters.closed_files_left, 1);
            let l = self.left.entry(slot).or_default();
            l.flushes.push_back(job);
            l.bytes += tail;
            while (l.bytes > budget || l.flushes.len() > LEFT_FILES)
                && let Some(old) = l.flushes.pop_front()
            {
                l.bytes -= old.end - old.start;
            }
            return;
        }
        let p = self.pending.entry(slot.clone()).or_insert_with(|| Pending {
            batch: Batch { owner: key.tgid as u64, flushes: Vec::new() },
            bytes: 0,
            since: now,
        });
        p.batch.flushes.push(job);
        p.bytes += tail;
        if p.bytes >= self.devices.window(&slot.0) || p.batch.flushes.len() >= BATCH_FILES {
            let p = self.pending.remove(&slot).expect("just used");
            self.flushers.submit(&slot.0, &dev, p.batch);
        }
    }

    /// A span whose file is reached by handle, at once.  Its writer counts
    /// as one on the device (for its dirty budget) like a multi-file writer,
    /// until it exits or stops.
    fn by_handle(&mut self, key: StreamKey, ev: &wb_event, dev: &Arc<crate::devices::DeviceShared>) {
        let now = Instant::now();
        self.note_writer(key.tgid, ev, ev.end - ev.start, now).windowed = true;
        let device_busy = self.devices.dirtied(&ev.bdi(), ev.end - ev.start, now);
        self.writer_busy(key.tgid, device_busy);
        if !dev.flushes_span_to(ev.end) {
            return;
        }
        if ev.observed() {
            return Would::Window { bytes: ev.end - dev.flush_start(ev.start) }.count(&self.counters);
        }
        if let Some(job) = self.flush_of(ev, Target::Window(closed_file(key, ev, None)), dev) {
            if let Some(w) = self.writers.get(&key.tgid) {
                let unit = w.unit.clone();
                self.units.written_behind(&unit, job.end - job.start);
            }
            self.flushers.submit(&ev.bdi(), dev, Batch { owner: key.tgid as u64, flushes: vec![job] });
        }
    }

    fn note_writer(&mut self, tgid: u32, ev: &wb_event, bytes: u64, now: Instant) -> &mut Writer {
        let (devices, units) = (&self.devices, &mut self.units);
        let w = self.writers.entry(tgid).or_insert_with(|| {
            let observe = ev.observed();
            let (bdi, comm) = (ev.bdi(), printable(&ev.comm()));
            let (cgroup, unit) = unit_of(tgid);
            tracing::info!(
                pid = tgid, %comm, unit = %printable(&unit), cgroup = %printable(&cgroup), %bdi,
                name = %devices.name(&bdi), observe, "multi-file writer started"
            );
            units.stream_started(&unit, &cgroup, observe);
            Writer::new(ev.comm(), (cgroup, unit), ev.bdi(), now, false, observe)
        });
        w.add(bytes, now);
        w.observe = ev.observed();
        w
    }

    /// Pacing for a writer that counts, at once (Devices::busy).
    fn writer_busy(&mut self, tgid: u32, device_busy: bool) {
        let Some(w) = self.writers.get(&tgid) else { return };
        let own = w.rate.meaningful(Instant::now(), self.devices.bandwidth(&w.bdi));
        if device_busy || own {
            // Its files are small, written best by the kernel under a cap
            // (devices::SMALL_FILES), if it writes enough of them itself:
            // another user's one-byte file every 100 ms, counted because
            // root's copy kept the disk busy, capped a 2.8 GB/s disk that
            // kept up (hardening's trickle of tiny files).
            let (bdi, small) = (w.bdi.clone(), own && w.bytes < crate::devices::SMALL_FILES * w.files);
            self.devices.busy(&bdi, small, !w.observe);
        }
    }

    /// Submits batches that waited long enough; reports idle writers;
    /// resizes windows and paces devices.
    pub fn tick(&mut self, on_battery: bool) {
        let now = Instant::now();
        let due: Vec<(String, u32)> =
            self.pending.iter().filter(|(_, p)| now - p.since >= BATCH_AGE).map(|(k, _)| k.clone()).collect();
        for slot in due {
            let p = self.pending.remove(&slot).expect("listed above");
            self.submit(&slot.0, p.batch);
        }
        // An exited writer ends now: left for WRITER_IDLE it counted as a
        // second concurrent writer for the next copy to the device, whose
        // budget became stream_dirty twice over (gio after cp -r to a USB
        // stick: 28 MiB held and sync 1.01 s, against 14 MiB and 0.39 s).
        let mut ended = Vec::new();
        self.writers.retain(|&pid, w| {
            let gone = w.ended(pid, now, WRITER_IDLE);
            if gone {
                ended.push(pid);
            }
            !gone
        });
        self.nodes.retain(|&(pid, _), w| !w.ended(pid, now, WRITER_IDLE));
        let done: Vec<_> = self.left.extract_if(|(_, pid), _| ended.contains(pid)).collect();
        for ((bdi, pid), l) in done {
            self.submit(&bdi, l.batch(pid));
        }
        // Concurrent streams per device: each file being streamed, and each
        // multi-file writer not streaming a file there already (cp -r
        // writing one big file is one stream, not two).
        let mut active: HashMap<String, Active> = HashMap::new();
        // Devices where one of them acts: only those are paced for real
        // (devices::decide::observed).
        let mut acting: HashSet<String> = HashSet::new();
        let mut streaming: HashSet<(&str, u32)> = HashSet::new();
        // A stream that has not written for `quiet` no longer counts: a
        // writer that keeps its file open and stops must not keep the
        // device (and every other writer of it) paced.
        let quiet = self.devices.quiet();
        // Nor does one, or a multi-file writer, that writes too slowly to
        // need it (bandwidth::MEANINGFUL).
        let devices = &self.devices;
        let busy = devices.dirtying(now);
        let counts = |s: &Stream| s.counts(now, quiet, devices.bandwidth(&s.bdi), busy.contains(s.bdi.as_str()));
        for (key, s) in self.streams.iter().filter(|(_, s)| counts(s)) {
            active.entry(s.bdi.clone()).or_default().add(true);
            if !s.observe {
                acting.insert(s.bdi.clone());
            }
            streaming.insert((&s.bdi, key.tgid));
        }
        let nodes = self.nodes.iter().map(|((pid, _), w)| (pid, w));
        for (pid, w) in self.writers.iter().chain(nodes) {
            let recent = busy.contains(w.bdi.as_str()) && now - w.last < WRITER_RECENT;
            if !streaming.contains(&(w.bdi.as_str(), *pid))
                && (recent || w.rate.meaningful(now, devices.bandwidth(&w.bdi)))
            {
                active.entry(w.bdi.clone()).or_default().add(w.windowed);
                if !w.observe {
                    acting.insert(w.bdi.clone());
                }
            }
        }
        self.devices.tick(&active, &acting, on_battery);
        self.account_units(now);
        self.flushers.retire_idle();
        let flushers = &self.flushers;
        self.devices.forget_idle(now, |bdi| flushers.has(bdi));
    }

    /// The root policy changed (reload); `observing`: the whole daemon
    /// observes (PolicySet::observes).
    pub fn set_policy(&mut self, policy: crate::policy::Policy, observing: bool) {
        self.devices.set_policy(policy);
        self.devices.set_observing(observing);
    }

    /// A batch for a device an event named lately.  One forgotten since
    /// (idle for DEVICE_IDLE, longer than anything waits here) gets
    /// nothing: its files are left to the kernel.
    fn submit(&mut self, bdi: &str, batch: Batch) {
        if let Some(dev) = self.devices.device(bdi) {
            self.flushers.submit(bdi, &dev, batch);
        }
    }

    /// Ends streams whose close the agent did not see: the writer exited,
    /// or its descriptor no longer names the file (closed at execve by
    /// O_CLOEXEC, through io_uring, or its event lost).  A held file pins
    /// the inode and makes umount fail, so it goes within a second or two.
    /// Only streams with no span in the last second are checked (a
    /// procfs read each).
    pub fn reap(&mut self) {
        let gone: Vec<(StreamKey, &'static str)> = self
            .streams
            .iter()
            .filter_map(|(k, s)| {
                if s.file.writer_exited() {
                    Some((*k, "writer exited"))
                } else if s.last_span.elapsed() >= Duration::from_secs(1)
                    && sys::fd_still_names(k.tgid, s.fd, k.file) == Some(false)
                {
                    Some((*k, "closed unseen"))
                } else {
                    None
                }
            })
            .collect();
        for (key, why) in gone {
            let s = self.streams.remove(&key).expect("listed above");
            self.ended(key, s, 0, why);
        }
    }

    fn ended(&mut self, key: StreamKey, s: Stream, tail: u64, why: &str) {
        s.file.end();
        // Logged again only once well below the one-user share (half).
        if self.streams.len() < self.max_held / 4 {
            self.over_cap_logged = false;
        }
        let secs = s.started.elapsed().as_secs_f64();
        tracing::info!(
            pid = key.tgid, comm = %printable(&s.comm), unit = %printable(&s.unit), fd = s.fd, ino = key.file.ino,
            bdi = %s.bdi, bytes = s.bytes + tail, spans = s.spans, secs = format!("{secs:.1}"),
            "stream ended ({why})"
        );
    }

    /// Ends every stream (daemon shutdown) after queued spans are submitted.
    /// The streams end before the flusher threads stop, so that their
    /// files go back to the threads that opened them, to be closed there
    /// (a close may wait for its server).  The administrator's bdi limits
    /// go back before the threads are waited for: a device hung in
    /// writeback may keep its flusher thread for ever.
    pub fn shutdown(&mut self) {
        for ((bdi, _), p) in std::mem::take(&mut self.pending) {
            self.submit(&bdi, p.batch);
        }
        for ((bdi, pid), l) in std::mem::take(&mut self.left) {
            self.submit(&bdi, l.batch(pid));
        }
        for (key, s) in std::mem::take(&mut self.streams) {
            self.ended(key, s, 0, "daemon stopping");
        }
        self.devices.shutdown();
        self.flushers.shutdown(SHUTDOWN_WAIT);
    }

    /// Errors of kind `kind` are counted by the caller (ring-buffer decode).
    pub fn error(&self, kind: ErrorKind) {
        self.counters.error(kind);
    }
}
