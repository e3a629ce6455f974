//! The flusher threads: one per backing device, started at its first batch
//! (within USER_DEVICE_THREADS for devices users made), ended once idle,
//! stopped at shutdown; and what a device's queue takes before the rest is
//! left to the kernel.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
        mpsc,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use super::{Batch, submitter::Submitter};
use crate::{
    admission::{Backlog, MAX_QUEUED},
    counters::{Counters, ErrorKind},
    devices::DeviceShared,
};

/// A device's flusher thread, as the intake side sees it.
struct Queue {
    tx: mpsc::Sender<Batch>,
    handle: JoinHandle<()>,
    backlog: Arc<Backlog>,
    /// "Queue full" was logged (again once it has drained to half).
    full_logged: bool,
    /// When it was last given a batch.
    last: Instant,
    /// Its device: whether a user sets its speed (DeviceShared::
    /// user_made) is asked when threads are counted, not once at the
    /// start (a layered device is a user's until its owner is known).
    device: Arc<DeviceShared>,
    /// Streams' files it opened and has not closed (job::Home).
    held: Arc<AtomicUsize>,
}

/// Counts `n` flushes left to the kernel as `kind`, and logs the first of
/// a run of them (`logged` is cleared where the run ends).
fn left_to_kernel(counters: &Counters, kind: ErrorKind, n: usize, logged: &mut bool, log: impl FnOnce()) {
    counters.errors_add(kind, n as u64);
    if !std::mem::replace(logged, true) {
        log();
    }
}

/// Threads for devices whose speed a user sets, at once.  A thread stuck in
/// the kernel on a stalled device (a FUSE server that stopped answering,
/// in the middle of a writeback the thread waits for) cannot be ended, and
/// every thread counts against the unit's TasksMax (64): a user stalling
/// one FUSE mount after another took every task the daemon had.  Beyond
/// this many, such devices' writeback is left to the kernel, counted as
/// no_thread; disks, sticks and the administrator's mounts are not held
/// back by it.
pub const USER_DEVICE_THREADS: usize = 8;

/// A device's thread is ended once it was given nothing for this long (and
/// has nothing queued), and started again at its next batch.  Every FUSE
/// mount is a device, and user namespaces let a user make any number of
/// them: a thread kept for each device ever written would let one user
/// make the daemon run out of tasks.
const THREAD_IDLE: Duration = Duration::from_secs(60);

pub struct Flushers {
    devices: HashMap<String, Queue>,
    counters: Arc<Counters>,
    /// Set at shutdown: submit what is queued, skip the waits.
    stopping: Arc<AtomicBool>,
    /// A failed thread start was logged (again once one starts).
    no_thread_logged: bool,
    /// USER_DEVICE_THREADS was reached and logged (again once below it).
    user_threads_logged: bool,
}

impl Flushers {
    pub fn new(counters: Arc<Counters>) -> Self {
        Self {
            devices: HashMap::new(),
            counters,
            stopping: Arc::new(AtomicBool::new(false)),
            no_thread_logged: false,
            user_threads_logged: false,
        }
    }

    /// Queues a batch for the device's thread, or leaves it to the kernel:
    /// counted as over_cap when the device is MAX_QUEUED flushes behind (or
    /// the batch's user holds its share of them, admission::fits), as
    /// no_thread when its thread cannot be started (the unit's TasksMax, a
    /// pids limit, no memory for a stack).
    pub fn submit(&mut self, bdi: &str, device: &Arc<DeviceShared>, batch: Batch) {
        let n = batch.flushes.len();
        if !self.devices.contains_key(bdi) {
            let user_threads = self.devices.values().filter(|q| q.device.user_made()).count();
            if device.user_made() && user_threads >= USER_DEVICE_THREADS {
                return left_to_kernel(&self.counters, ErrorKind::NoThread, n, &mut self.user_threads_logged, || {
                    tracing::warn!(
                        bdi,
                        max = USER_DEVICE_THREADS,
                        "devices users made already have their flusher threads: this one's writeback is left to the kernel"
                    )
                });
            }
            self.user_threads_logged &= user_threads + 1 >= USER_DEVICE_THREADS;
            match self.start(bdi, device) {
                Ok(q) => {
                    self.devices.insert(bdi.to_owned(), q);
                    self.no_thread_logged = false;
                }
                Err(e) => {
                    return left_to_kernel(
                        &self.counters,
                        ErrorKind::NoThread,
                        n,
                        &mut self.no_thread_logged,
                        || tracing::warn!(bdi, error = %e, "cannot start a flusher thread: the device's writeback is left to the kernel"),
                    );
                }
            }
        }
        let q = self.devices.get_mut(bdi).expect("started above");
        q.last = Instant::now();
        if !q.backlog.try_add(n, batch.user()) {
            return left_to_kernel(&self.counters, ErrorKind::OverCap, n, &mut q.full_logged, || {
                tracing::warn!(
                    bdi,
                    max = MAX_QUEUED,
                    "flush queue full: the excess is left to the kernel until the device catches up"
                )
            });
        }
        if q.backlog.len() < MAX_QUEUED / 2 {
            q.full_logged = false;
        }
        // The thread only ends when its sender is dropped, so send cannot fail.
        let _ = q.tx.send(batch);
    }

    fn start(&self, bdi: &str, device: &Arc<DeviceShared>) -> std::io::Result<Queue> {
        let (tx, rx) = mpsc::channel();
        let backlog = Arc::new(Backlog::default());
        let held = Arc::new(AtomicUsize::new(0));
        let mut submitter = Submitter::new(device.clone(), self.counters.clone(), self.stopping.clone(), held.clone());
        let drained = backlog.clone();
        let handle = thread::Builder::new().name(format!("flush-{bdi}")).spawn(move || submitter.run(rx, &drained))?;
        Ok(Queue { tx, handle, backlog, full_logged: false, last: Instant::now(), device: device.clone(), held })
    }

    /// Whether the device has a flusher thread.
    pub fn has(&self, bdi: &str) -> bool {
        self.devices.contains_key(bdi)
    }

    /// Ends the threads of devices idle for THREAD_IDLE and waiting for
    /// work with nothing in flight and no stream's file open (its close
    /// is that thread's): dropping the sender ends the thread.
    pub fn retire_idle(&mut self) {
        let now = Instant::now();
        self.devices.retain(|bdi, q| {
            let idle = now - q.last >= THREAD_IDLE
                && q.backlog.len() == 0
                && q.backlog.parked()
                && q.held.load(Ordering::Relaxed) == 0;
            if idle {
                tracing::debug!(bdi, "flusher thread ended (idle)");
            }
            !idle
        });
    }

    /// Hands every queued span to writeback (without waiting for any) and
    /// stops the threads: starting writeback is quick, so this is prompt —
    /// except on a device that is hung (or very slow) in writeback, whose
    /// thread may sit in sync_file_range's wait.  Such a thread is waited for
    /// at most `within`, then left: the caller has put the bdi limits back
    /// already, and the process, though it cannot finish exiting while that
    /// thread sleeps uninterruptibly, has nothing left to do.
    pub fn shutdown(&mut self, within: std::time::Duration) {
        self.stopping.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + within;
        // Dropping each sender ends its thread once its queue is done.
        let threads: Vec<(String, JoinHandle<()>)> = self.devices.drain().map(|(bdi, q)| (bdi, q.handle)).collect();
        for (bdi, handle) in threads {
            while !handle.is_finished() && Instant::now() < deadline {
                thread::sleep(std::time::Duration::from_millis(10));
            }
            if handle.is_finished() {
                let _ = handle.join();
            } else {
                tracing::warn!(
                    bdi,
                    secs = within.as_secs(),
                    "device still busy in writeback: not waiting for it any longer"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        abi::RelPath,
        admission::{FLUSH_MEMORY, FlushMemory},
        flusher::{Flush, Target, job::batch},
        handles::ClosedFile,
    };

    /// Closed files with 4 KiB paths (exFAT) on many devices whose threads
    /// never drain: what they hold together stays within FLUSH_MEMORY,
    /// where each device's MAX_QUEUED alone would let 8 devices hold 2 GiB.
    #[test]
    fn paths_queued_on_many_hung_devices_stay_within_flush_memory() {
        let counters = Arc::new(Counters::default());
        let mut f = Flushers::new(counters.clone());
        let memory = FlushMemory::new(FLUSH_MEMORY);
        let dev = Arc::new(DeviceShared::for_tests());
        let path: RelPath = std::ffi::CString::new(vec![b'a'; 4095]).unwrap().into();
        let (mut queued, mut refused) = (0u64, 0u64);
        for d in 0..8 {
            let (tx, rx) = mpsc::channel();
            std::mem::forget(rx);
            let backlog = Arc::new(Backlog::default());
            let q = Queue {
                tx,
                handle: thread::spawn(|| ()),
                backlog,
                full_logged: false,
                last: Instant::now(),
                device: Arc::new(DeviceShared::for_tests()),
                held: Default::default(),
            };
            f.devices.insert(format!("hung{d}"), q);
            for i in 0..MAX_QUEUED as u64 {
                let file = ClosedFile { path: Some(path.clone()), ..batch(1, i).flushes.remove(0).target_file() };
                match Flush::new(Target::Closed(file), 0, 1, d, &memory) {
                    Some(job) => {
                        f.submit(&format!("hung{d}"), &dev, Batch { owner: d as u64, flushes: vec![job] });
                        queued += 1;
                    }
                    None => refused += 1,
                }
            }
        }
        assert!(memory.used() <= FLUSH_MEMORY, "{} bytes held", memory.used());
        assert!(queued > 7000 && refused > 500_000, "queued {queued}, refused {refused}");
    }

    /// A device whose thread never drains (hung in writeback) takes
    /// at most half of MAX_QUEUED flushes from one user, a quarter from a
    /// second: the rest are counted, not queued.
    #[test]
    fn a_hung_device_queues_at_most_max_queued() {
        let counters = Arc::new(Counters::default());
        let mut f = Flushers::new(counters.clone());
        let (tx, _rx) = mpsc::channel();
        let handle = thread::spawn(|| ());
        let backlog = Arc::new(Backlog::default());
        f.devices.insert(
            "hung".into(),
            Queue {
                tx,
                handle,
                backlog: backlog.clone(),
                full_logged: false,
                last: Instant::now(),
                device: Arc::new(DeviceShared::for_tests()),
                held: Default::default(),
            },
        );
        let dev = Arc::new(DeviceShared::for_tests());
        for i in 0..(MAX_QUEUED as u64 + 100) {
            f.submit("hung", &dev, batch(1, i));
        }
        assert_eq!(backlog.len(), MAX_QUEUED / 2, "one user's half");
        for i in 0..(MAX_QUEUED as u64 / 2) {
            f.submit("hung", &dev, batch(2, i));
        }
        assert_eq!(backlog.len(), MAX_QUEUED / 2 + MAX_QUEUED / 4, "and a second user's quarter");
        let over = counters.errors().into_iter().find(|e| e.0 == "over_cap").unwrap().1;
        assert_eq!(over, MAX_QUEUED as u64 / 2 + 100 + MAX_QUEUED as u64 / 4);
    }
}
