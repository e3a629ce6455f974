//! Loading and attaching the BPF programs, and the agent's handles on their
//! maps.  Everything attached here is detached when `Loaded` is dropped:
//! nothing is pinned, so if the daemon dies the kernel is back to defaults.

use std::path::Path;

use anyhow::{Context, Result, bail};
use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Array, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, FEntry, FExit, TracePoint},
};

use crate::{
    abi::{
        wb_config, wb_policy, wb_stat, wb_syscalls_WB_SC_ALL as WB_SC_ALL, wb_syscalls_WB_SC_SPLICE as WB_SC_SPLICE,
        wb_syscalls_WB_SC_VECTORED as WB_SC_VECTORED,
    },
    devices::DeviceMap,
};

/// The `cgroup_policies` map.
pub(crate) type CgroupMap = aya::maps::HashMap<MapData, u64, wb_policy>;

static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/writebehind.bpf.o"));
/// The same programs for kernels without bpf_loop (before 5.17: Debian 11's
/// 5.10, Ubuntu 22.04's 5.15): probe reads of the task and bounded loops
/// (bpf/compat.bpf.h, WB_COMPAT).
static BPF_OBJECT_COMPAT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/writebehind-compat.bpf.o"));
/// Set to "compat", the compat object is loaded whatever the kernel has
/// (the tests run it on this kernel too).
const OBJECT_ENV: &str = "WB_BPF_OBJECT";
const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

const TRACEFS: &str = "/sys/kernel/tracing";

/// Process exit: both backends.
const PROCESS_EXIT: (&str, &str) = ("wb_process_exit", "sched_process_exit");
/// Pages dirtied where no write hook looks (mmap stores, io_uring, AIO):
/// both backends, where the kernel has the tracepoint (5.17+; optional).
const DIRTY_FOLIO: (&str, &str) = ("wb_dirty_folio", "writeback_dirty_folio");
/// Writes at every syscall exit: the tracepoint backend, and the fentry
/// backend's stand-in for write functions it cannot hook.
const SYS_EXIT: (&str, &str) = ("wb_sys_exit", "sys_exit");

/// The fentry backend's write hooks: (program, function, the syscalls
/// sys_exit reports instead when the function cannot be hooked; 0: required).
const FEXIT_WRITES: &[(&str, &str, u32)] = &[
    ("wb_vfs_write", "vfs_write", 0),
    ("wb_vfs_writev", "vfs_writev", WB_SC_VECTORED),
    ("wb_vfs_iter_write", "vfs_iter_write", WB_SC_SPLICE),
];
/// From Linux 6.8 splice writes skip vfs_iter_write (bpf/writebehind.bpf.c,
/// wb_splice_write): hooked there on those kernels only, where it cannot
/// see a write twice.
const SPLICE_WRITE: (&str, &str, (u32, u32)) = ("wb_splice_write", "iter_file_splice_write", (6, 8));
/// Close hooks, the first this kernel has: filp_flush from 6.8, filp_close before.
const FENTRY_CLOSES: &[(&str, &str)] = &[("wb_filp_flush", "filp_flush"), ("wb_filp_close", "filp_close")];
/// Syncs a writer asks for itself (optional: without them such a writer's
/// files are streamed like any other's).  Not their syscall tracepoints:
/// hooking any syscall tracepoint sends every syscall of every task down
/// the traced path (+64 to +87 ns each, docs/measurements.md), which the fentry backend
/// otherwise avoids.
const FENTRY_SYNCS: &[(&str, &str)] = &[
    ("wb_sys_fsync", "__x64_sys_fsync"),
    ("wb_sys_fdatasync", "__x64_sys_fdatasync"),
    ("wb_sys_sync_file_range", "__x64_sys_sync_file_range"),
];

/// Which hooks feed the stream logic (bpf/writebehind.bpf.c).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Try fentry, fall back to tracepoints (the default).
    Auto,
    Fentry,
    Tracepoint,
}

/// (program, syscall tracepoint) pairs: closes, seen while the fd still
/// names the file, and syncs a writer asks for itself.
const SYSCALL_HOOKS: &[(&str, &str)] = &[
    ("wb_enter_close", "sys_enter_close"),
    ("wb_enter_close_range", "sys_enter_close_range"),
    ("wb_enter_dup2", "sys_enter_dup2"),
    ("wb_enter_dup3", "sys_enter_dup3"),
    ("wb_enter_fsync", "sys_enter_fsync"),
    ("wb_enter_fdatasync", "sys_enter_fdatasync"),
    ("wb_enter_sync_file_range", "sys_enter_sync_file_range"),
];

pub(crate) struct Loaded {
    // Fields drop in order: programs detach before tracefs is unmounted.
    ebpf: Ebpf,
    _tracefs: TracefsMount,
    /// What is attached, for logs and `wbctl status`: "fentry",
    /// "tracepoint", or "fentry+sys_exit(vfs_writev)" where a function was
    /// missing; "+dirty" where pages dirtied by mmap stores and io_uring are seen.
    pub(crate) backend: String,
}

/// Refuses early, with the reason, what would otherwise fail obscurely.
pub fn check_environment() -> Result<()> {
    if !crate::sys::is_root() {
        bail!(
            "writebehindd must run as root: it loads BPF programs (CAP_BPF, CAP_PERFMON), \
             opens other processes' files (CAP_SYS_PTRACE) and writes bdi settings"
        );
    }
    if !Path::new(VMLINUX_BTF).exists() {
        bail!(
            "this kernel has no BTF (/sys/kernel/btf/vmlinux is missing); \
             writebehindd needs a kernel built with CONFIG_DEBUG_INFO_BTF=y"
        );
    }
    // The oldest kernel: 5.8, for the BPF ring buffer (and tp_btf, 5.5);
    // 5.10 is the oldest one tested (cargo xtask vmtest).  By feature, not
    // by version: distribution kernels backport.  aya's probe creates one:
    // a kernel without the type refuses it (EINVAL).  A probe that fails
    // otherwise (this runs before logging is set up) refuses nothing here:
    // loading the programs says why.
    if let Ok(false) = aya::sys::is_map_supported(aya::maps::MapType::RingBuf) {
        bail!(
            "this kernel has no BPF ring buffer: writebehindd needs Linux 5.8 or later (or a kernel with it backported)"
        );
    }
    Ok(())
}

/// Why a syscall tracepoint's perf event may be refused: Debian's kernels
/// default to kernel.perf_event_paranoid=3, their own level, at which
/// perf_event_open refuses whoever lacks CAP_SYS_ADMIN (EACCES), which the
/// unit does not grant (systemd/writebehindd.service says how to).
fn paranoid_hint() -> &'static str {
    let level = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").ok();
    match level.and_then(|l| l.trim().parse::<i32>().ok()) {
        Some(l) if l > 2 => {
            "; kernel.perf_event_paranoid is above 2, where perf events need CAP_SYS_ADMIN: \
             under systemd, `systemctl edit writebehindd` and add CapabilityBoundingSet=CAP_SYS_ADMIN"
        }
        _ => "",
    }
}

/// The BPF object for this kernel: the compat one where bpf_loop is
/// missing (or WB_BPF_OBJECT=compat); its name for the backend's.
fn object() -> (&'static [u8], &'static str) {
    let forced = std::env::var(OBJECT_ENV).is_ok_and(|v| v == "compat");
    if forced || !has_bpf_loop() { (BPF_OBJECT_COMPAT, "+compat") } else { (BPF_OBJECT, "") }
}

/// Whether the kernel has the bpf_loop helper (5.17+, or backported):
/// aya loads a tracepoint program that calls it and reads the verifier's
/// answer (tracepoint, fentry and tp_btf programs all reach it through
/// the same base helpers).  A probe that fails counts as missing: the
/// compat object loads on every kernel.
fn has_bpf_loop() -> bool {
    use aya::{programs::ProgramType, sys::BpfHelper};
    aya::sys::is_helper_supported(ProgramType::TracePoint, BpfHelper::BPF_FUNC_loop).unwrap_or_else(|e| {
        tracing::info!(error = %e, "cannot probe for bpf_loop; loading the compat programs");
        false
    })
}

impl Loaded {
    pub(crate) fn load_and_attach(mut cfg: wb_config, backend: Backend) -> Result<Self> {
        let tracefs = TracefsMount::ensure()?;
        let btf = Btf::from_sys_fs().context("reading kernel BTF from /sys/kernel/btf/vmlinux")?;
        let (object, compat) = object();
        let ebpf = EbpfLoader::new().btf(Some(&btf)).load(object).context("loading the BPF object into the kernel")?;
        let mut me = Self { ebpf, _tracefs: tracefs, backend: String::new() };

        // (the backend's name, the write syscalls left to wb_sys_exit)
        let fentry = match backend {
            Backend::Tracepoint => None,
            _ => match me.load_fentry(&btf) {
                Ok(attached) => Some(attached),
                Err(e) if backend == Backend::Auto => {
                    // The first line says which program; a verifier's
                    // reason is its log's last lines.
                    let reason = format!("{e:#}");
                    let lines: Vec<&str> = reason.lines().filter(|l| !l.trim().is_empty()).collect();
                    let last = lines.iter().rev().take(3).rev().copied().collect::<Vec<_>>().join(" | ");
                    tracing::info!(
                        reason = %lines.first().unwrap_or(&""),
                        verifier = %if lines.len() > 1 { last.as_str() } else { "" },
                        "fentry refused; using syscall tracepoints"
                    );
                    None
                }
                Err(e) => {
                    return Err(e.context(
                        "the fentry backend (--backend fentry) cannot load on this kernel; \
                         --backend auto falls back to syscall tracepoints",
                    ));
                }
            },
        };
        // The configuration first: wb_sys_exit reads which syscalls are its own.
        cfg.sys_exit_writes = fentry.as_ref().map_or(WB_SC_ALL, |f| f.1);
        me.set_config(cfg)?;
        if fentry.is_none() {
            for &(prog, tp) in SYSCALL_HOOKS {
                let p: &mut TracePoint = me.program(prog)?;
                p.load().with_context(|| format!("loading {prog}"))?;
                p.attach("syscalls", tp).with_context(|| {
                    format!(
                        "attaching {prog} to syscalls/{tp} (needs a kernel with CONFIG_FTRACE_SYSCALLS){}",
                        paranoid_hint()
                    )
                })?;
            }
        }
        me.backend = fentry.map_or_else(|| "tracepoint".into(), |f| f.0);
        let mut btf_hooks = vec![PROCESS_EXIT];
        if cfg.sys_exit_writes != 0 {
            btf_hooks.push(SYS_EXIT);
        }
        for (prog, tp) in btf_hooks {
            let p: &mut BtfTracePoint = me.program(prog)?;
            p.load(tp, &btf).with_context(|| format!("loading {prog}"))?;
            p.attach().with_context(|| format!("attaching {prog} to tp_btf/{tp} (needs CONFIG_DEBUG_INFO_BTF)"))?;
        }
        me.backend += compat;
        let (prog, tp) = DIRTY_FOLIO;
        let p: &mut BtfTracePoint = me.program(prog)?;
        match p.load(tp, &btf).and_then(|_| p.attach().map(drop)) {
            Ok(()) => me.backend += "+dirty",
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "cannot hook {tp}: writers through mmap and io_uring are not seen")
            }
        }
        Ok(me)
    }

    /// Loads and attaches the fentry hooks; returns the backend's name and
    /// the write syscalls left to sys_exit.  On failure nothing of it stays
    /// attached.
    fn load_fentry(&mut self, btf: &Btf) -> Result<(String, u32)> {
        let mut missing = 0;
        let mut loaded = Vec::new();
        let mut gaps = Vec::new();
        let r = (|| -> Result<()> {
            for &(prog, func, stand_in) in FEXIT_WRITES {
                let p: &mut FExit = self.program(prog)?;
                match p.load(func, btf).and_then(|_| p.attach().map(drop)) {
                    Ok(()) => loaded.push(prog),
                    Err(e) if stand_in != 0 => {
                        tracing::info!(function = func, error = %e, "cannot hook; its syscalls are seen at sys_exit");
                        missing |= stand_in;
                        gaps.push(func);
                    }
                    Err(e) => return Err(e).with_context(|| format!("loading {prog} (fexit/{func})")),
                }
            }
            let (prog, func, since) = SPLICE_WRITE;
            if kernel_at_least(since) {
                let p: &mut FExit = self.program(prog)?;
                match p.load(func, btf).and_then(|_| p.attach().map(drop)) {
                    Ok(()) => {
                        loaded.push(prog);
                        // Splice writes go through here only, from 6.8:
                        // sys_exit must not count them too, even if
                        // vfs_iter_write could not be hooked.
                        missing &= !WB_SC_SPLICE;
                        gaps.retain(|g| *g != "vfs_iter_write");
                    }
                    Err(e) => {
                        tracing::info!(function = func, error = %e, "cannot hook; its syscalls are seen at sys_exit");
                        missing |= WB_SC_SPLICE;
                        gaps.push(func);
                    }
                }
            }
            let mut errors = Vec::new();
            for &(prog, func) in FENTRY_CLOSES {
                let p: &mut FEntry = self.program(prog)?;
                match p.load(func, btf).and_then(|_| p.attach().map(drop)) {
                    Ok(()) => {
                        loaded.push(prog);
                        return Ok(());
                    }
                    Err(e) => errors.push(format!("fentry/{func}: {e}")),
                }
            }
            anyhow::bail!("no close hook: {}", errors.join("; "))
        })();
        if let Err(e) = r {
            for prog in loaded {
                if let Some(p) = self.ebpf.program_mut(prog) {
                    let _ = match p {
                        aya::programs::Program::FEntry(p) => p.unload(),
                        aya::programs::Program::FExit(p) => p.unload(),
                        _ => Ok(()),
                    };
                }
            }
            return Err(e);
        }
        for &(prog, func) in FENTRY_SYNCS {
            let p: &mut FEntry = self.program(prog)?;
            if let Err(e) = p.load(func, btf).and_then(|_| p.attach().map(drop)) {
                tracing::info!(function = func, error = %e, "cannot hook; files their writer syncs through it are streamed");
            }
        }
        let name = if gaps.is_empty() { "fentry".into() } else { format!("fentry+sys_exit({})", gaps.join(",")) };
        Ok((name, missing))
    }

    /// A program of the object, as the type its section says it is.
    fn program<'a, T>(&'a mut self, name: &str) -> Result<&'a mut T>
    where
        &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
    {
        let p = self.ebpf.program_mut(name).with_context(|| format!("BPF object lacks program {name}"))?;
        Ok(p.try_into()?)
    }

    /// The in-kernel trigger: window, burst allowance, quiet time.
    pub(crate) fn set_config(&mut self, cfg: wb_config) -> Result<()> {
        let mut map: Array<_, wb_config> =
            Array::try_from(self.ebpf.map_mut("wb_config_map").context("no wb_config_map")?)?;
        map.set(0, cfg, 0).context("writing wb_config_map")?;
        Ok(())
    }

    /// The maps the agent tunes BPF through: (wb_config_map, devices,
    /// cgroup_policies).  Taken once.
    pub(crate) fn take_tuning(&mut self) -> Result<(Array<MapData, wb_config>, DeviceMap, CgroupMap)> {
        let mut take = |name: &str| self.ebpf.take_map(name).with_context(|| format!("map {name} already taken"));
        Ok((
            Array::try_from(take("wb_config_map")?)?,
            aya::maps::HashMap::try_from(take("devices")?)?,
            aya::maps::HashMap::try_from(take("cgroup_policies")?)?,
        ))
    }

    /// The stream map and each user's count of it, to their recount
    /// thread (shares.rs).  Taken once.
    pub(crate) fn take_shares(&mut self) -> Result<crate::shares::Shares> {
        let mut take = |name: &str| self.ebpf.take_map(name).with_context(|| format!("map {name} already taken"));
        Ok(crate::shares::Shares::start(
            aya::maps::HashMap::try_from(take("streams")?)?,
            aya::maps::HashMap::try_from(take("user_streams")?)?,
        ))
    }

    /// The ring buffer the programs report through; taken once by intake.
    pub(crate) fn take_events(&mut self) -> Result<RingBuf<MapData>> {
        let map = self.ebpf.take_map("events").context("events ring buffer already taken")?;
        Ok(RingBuf::try_from(map)?)
    }

    /// Sum over CPUs of one `stats` counter.
    pub(crate) fn stat(&self, which: wb_stat) -> u64 {
        let Some(map) = self.ebpf.map("stats") else {
            return 0;
        };
        let Ok(arr) = PerCpuArray::<_, u64>::try_from(map) else {
            return 0;
        };
        arr.get(&(which as u32), 0).map(|v| v.iter().sum()).unwrap_or(0)
    }
}

/// tracefs, mounted by us only if nobody had: syscall tracepoints are
/// found through it.  Unmounted on drop so the daemon leaves nothing behind.
struct TracefsMount {
    mounted: bool,
}

impl TracefsMount {
    fn ensure() -> Result<Self> {
        if Path::new(TRACEFS).join("events").exists() {
            return Ok(Self { mounted: false });
        }
        let src = std::ffi::CString::new("tracefs").unwrap();
        let dst = std::ffi::CString::new(TRACEFS).unwrap();
        let r = unsafe { libc::mount(src.as_ptr(), dst.as_ptr(), src.as_ptr(), 0, std::ptr::null()) };
        if r != 0 {
            bail!("tracefs is not mounted at {TRACEFS} and mounting it failed: {}", std::io::Error::last_os_error());
        }
        Ok(Self { mounted: true })
    }
}

impl Drop for TracefsMount {
    fn drop(&mut self) {
        if self.mounted {
            let path = std::ffi::CString::new(TRACEFS).unwrap();
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Whether the running kernel's release (uname -r: "6.12.117+deb12-amd64")
/// is at least `(major, minor)`; an unreadable release counts as older.
fn kernel_at_least(want: (u32, u32)) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    release_at_least(&release, want)
}

fn release_at_least(release: &str, want: (u32, u32)) -> bool {
    let mut nums = release.trim().split(|c: char| !c.is_ascii_digit()).map(|n| n.parse::<u32>().ok());
    match (nums.next().flatten(), nums.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= want,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::release_at_least;

    #[test]
    fn releases_compare_by_major_and_minor() {
        assert!(release_at_least("6.12.117+deb12-amd64", (6, 8)));
        assert!(release_at_least("6.8.0", (6, 8)));
        assert!(release_at_least("7.0.1\n", (6, 8)));
        assert!(!release_at_least("6.1.0-56-amd64", (6, 8)));
        assert!(!release_at_least("5.19.0", (6, 8)));
        assert!(!release_at_least("", (6, 8)));
    }
}
