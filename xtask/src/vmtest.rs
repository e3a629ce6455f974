//! `cargo xtask vmtest`: the integration tests on Debian's stock kernels,
//! where fentry loads (this machine's kernel refuses it): 5.10 (Debian 11's;
//! the oldest the daemon supports, guest::kernels::OLDEST), 6.1 (Debian
//! 12's), 6.12 (Debian 13's) and 7.2 (sid's), one guest after another.
//!
//! KVM cannot run stock kernels here (/dev/kvm is kvm_pvm), so the guest
//! runs under qemu's TCG emulation: Debian's own kernel packages (fetched
//! by guest::kernels, unpacked with `dpkg-deb -x`, modules indexed with
//! `depmod -b`), a busybox initramfs that mounts the host's root read-only
//! over 9p and chroots into it (xtask/vm/init), and a sparse scratch disk
//! for loop devices' backing files.  The guest runs the test binaries the
//! host built, once per backend, then the differential test.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use clap::ArgAction::Set;

use crate::guest::{self, kernels, need, run};

const INIT: &str = include_str!("../vm/init");
/// Modules the initramfs loads before the host's root is reachable.
const BOOT_MODULES: &[&str] = &["virtio_pci", "virtio_blk", "9pnet_virtio", "9p"];
const GUEST_MEM: &str = "6G";
const SCRATCH_GIB: u64 = 16;
/// One guest run (measured with --quick: 5.10 709 s and 7.2 405 s, 5.10
/// the slowest under TCG; without, 25 min on 6.1 before lifecycle ran on
/// both backends).
const TIMEOUT_QUICK: Duration = Duration::from_secs(15 * 60);
/// --quick beside the host tests, at idle priority: its pace is what the
/// host tests leave (5.10 642 s alone, 711 s beside them on this machine),
/// so it gets twice the time; the host's phases after it take 18 minutes,
/// and CI waits only for what is left of it after those.
const TIMEOUT_BESIDE: Duration = Duration::from_secs(30 * 60);
const TIMEOUT_FULL: Duration = Duration::from_secs(45 * 60);

/// The kernels --quick boots (CI's): the oldest, where the compat object
/// (no bpf_loop) loads and the differential test runs too.  systest
/// --quick boots the other three, where the unit's daemon runs on fentry.
/// Measured with lifecycle on both backends on each, on this 2-core
/// machine: 6.1 405 s, 6.12 390 s, 7.2 467 s (the differential test 74 s of
/// it), 5.10 709 s; with 7.2 here too and systest --quick on all four
/// kernels, CI's run took 63 min.  The full vmtest boots all four.
const QUICK_KERNELS: &[&str] = &[kernels::OLDEST];
/// --quick's lifecycle on the tracepoint backend (about 150 s a kernel)
/// runs on the oldest kernel only; systest's quick run checks that backend
/// under the real unit and systemd on the other three (tracepoint-backend-*).
const QUICK_TRACEPOINT_ON: &str = kernels::OLDEST;
const BACKENDS: &[&str] = &["fentry", "tracepoint"];
const FENTRY: &[&str] = &["fentry"];
/// Integration tests run in the guest on each backend: (test binary,
/// filter, the backends --quick runs it on).  The rest need what the guest
/// lacks (a blkio v1 cgroup to cap a device, systemd) or take too long
/// under emulation.  --quick runs most on fentry only: the differential
/// test below covers the tracepoint backend too; lifecycle runs on both
/// (the tracepoint backend on the oldest kernel), since the unit's
/// confinement must hold for whichever backend the daemon falls back to.
const PER_BACKEND: &[(&str, &str, &[&str])] = &[
    ("single_stream", "excluded_writers_cause_no_flush", FENTRY),
    ("single_stream", "writers_that_sync_their_own_files_are_left_alone", FENTRY),
    ("single_stream", "full_speed_dd_is_reported", &[]),
    ("single_stream", "exec_right_after_write_never_etxtbsy", &[]),
    ("multi_file", "temp_files_and_overwrites_are_written_once", &[]),
    ("multi_file", "tar_x_of_20000_files_is_held", &[]),
    ("reliability", "files_changed_under_a_stream_are_never_confused", &[]),
    ("lifecycle", "", BACKENDS),
    ("mmap_and_io_uring", "mapped_and_io_uring_writes_are_seen", FENTRY),
    // A block device's disk found from its node's open file: kernel layouts
    // differ (5.10-5.14 keep the bdi in the device, later ones in the disk).
    ("block_devices", "a_users_loop_device_written_through_its_node_steers_no_limit", &[]),
];
/// Run once a kernel, not per backend, since they choose backends
/// themselves: (test binary, filter on every kernel, filter on the oldest
/// and the newest).  On every kernel auto must pick fentry; the
/// differential test, which runs both backends, on the two ends.
const ONCE: &[(&str, &str, &str)] = &[("backends", "auto_picks_fentry", "")];
/// Sizes of the guest's tests are divided by this (WB_TEST_SCALE): TCG
/// emulation writes ~10× slower than the host.
const SCALE: u32 = 8;

struct Paths {
    dir: PathBuf,
}

impl Paths {
    fn new() -> Result<Self> {
        let dir = guest::target_dir()?.join("vmtest");
        fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }
}

/// A kernel's tree (boot/vmlinuz-*, lib/modules/*) from its packages,
/// unpacked once: the vmlinuz and the tree.
fn kernel(p: &Paths, version: &str) -> Result<(PathBuf, String, String)> {
    let k = kernels::line(version)?.fetch()?;
    let root = p.dir.join(&k.release);
    if !root.join(format!("lib/modules/{}/modules.dep", k.release)).exists() {
        let _ = fs::remove_dir_all(&root);
        for deb in &k.debs {
            run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&root))?;
        }
        // From trixie the modules are in /usr/lib/modules; modprobe -d and
        // depmod -b look in lib/modules.
        if !root.join("lib").exists() {
            std::os::unix::fs::symlink("usr/lib", root.join("lib"))?;
        }
        run(Command::new("depmod").arg("-b").arg(&root).arg(&k.release))?;
    }
    // From 7.2 the image is beside the modules (the package's postinst
    // copies it to /boot).
    let vmlinuz = [format!("boot/vmlinuz-{}", k.release), format!("lib/modules/{}/vmlinuz", k.release)]
        .into_iter()
        .map(|p| root.join(p))
        .find(|p| p.exists())
        .with_context(|| format!("no vmlinuz in {}", root.display()))?;
    Ok((vmlinuz, root.to_string_lossy().into_owned(), k.release))
}

/// `modules` and what they depend on, dependencies first, by modules.dep
/// (each line: "path: the paths it needs, in load order reversed").
fn module_closure(tree: &Path, release: &str, modules: &[&str]) -> Result<Vec<PathBuf>> {
    let dir = tree.join(format!("lib/modules/{release}"));
    let dep = fs::read_to_string(dir.join("modules.dep"))?;
    let deps: HashMap<&str, Vec<&str>> =
        dep.lines().filter_map(|l| l.split_once(':')).map(|(p, d)| (p, d.split_whitespace().collect())).collect();
    // Built in (6.12's virtio_pci): nothing to load.
    let builtin = fs::read_to_string(dir.join("modules.builtin"))?;
    let mut order: Vec<&str> = Vec::new();
    for m in modules {
        let file = format!("/{m}.ko");
        if builtin.lines().any(|l| l.ends_with(&file)) {
            continue;
        }
        let path = *deps
            .keys()
            .find(|p| MODULE_SUFFIXES.iter().any(|s| p.ends_with(&format!("{file}{s}"))))
            .with_context(|| format!("no module {m} in {release}"))?;
        // modules.dep lists every indirect dependency too, the deepest last.
        for d in deps[path].iter().rev().chain([&path]) {
            if !order.contains(d) {
                order.push(d);
            }
        }
    }
    Ok(order.into_iter().map(|p| dir.join(p)).collect())
}

/// How a module file may end: trixie's kernels compress them with xz.
const MODULE_SUFFIXES: &[&str] = &["", ".xz", ".zst"];

/// busybox, the boot modules (uncompressed: busybox's insmod loads only
/// plain ones) and the init script, as a newc cpio archive.
fn initramfs(p: &Paths, tree: &Path, release: &str) -> Result<PathBuf> {
    let root = p.dir.join(format!("initramfs-{release}"));
    let _ = fs::remove_dir_all(&root);
    for d in ["bin", "mods", "proc", "sys", "dev", "host"] {
        fs::create_dir_all(root.join(d))?;
    }
    fs::copy("/bin/busybox", root.join("bin/busybox")).context("/bin/busybox: install busybox-static")?;
    let mut names = Vec::new();
    for m in module_closure(tree, release, BOOT_MODULES)? {
        let file = m.file_name().unwrap().to_string_lossy().into_owned();
        let name = file.split(".ko").next().unwrap_or(&file).to_owned();
        let to = root.join("mods").join(format!("{name}.ko"));
        match m.extension().and_then(|x| x.to_str()) {
            Some(x @ ("xz" | "zst")) => {
                let tool = if x == "xz" { "xz" } else { "zstd" };
                run(Command::new(tool).arg("-qdc").arg(&m).stdout(fs::File::create(&to)?))?;
            }
            _ => drop(fs::copy(&m, &to)?),
        }
        names.push(name);
    }
    fs::write(root.join("modules"), names.join("\n"))?;
    fs::write(root.join("init"), INIT)?;
    run(Command::new("chmod").arg("+x").arg(root.join("init")).arg(root.join("bin/busybox")))?;
    let out = root.with_extension("cpio");
    run(Command::new("sh").arg("-c").arg(format!(
        "cd {} && find . | cpio --quiet -o -H newc > {}",
        root.display(),
        out.display()
    )))?;
    Ok(out)
}

/// The workspace's test binaries by name (single_stream, ...), built now.
fn test_binaries() -> Result<Vec<(String, PathBuf)>> {
    let out =
        run(Command::new(env!("CARGO")).args(["test", "--workspace", "--no-run", "--message-format=json", "--quiet"]))?;
    let mut bins = Vec::new();
    for line in out.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let (Some(exe), Some(name)) = (v["executable"].as_str(), v["target"]["name"].as_str()) else { continue };
        if v["target"]["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "test")) {
            bins.push((name.to_owned(), PathBuf::from(exe)));
        }
    }
    Ok(bins)
}

/// What a run does: --quick, and --only/--backend narrowing it.
#[derive(Default)]
struct Selection {
    quick: bool,
    /// Test binaries (none: all).
    only: Vec<String>,
    /// Backends (none: both).
    backends: Vec<String>,
}

impl Selection {
    fn runs(&self, bin: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == bin)
    }

    /// Whether `bin` runs on `backend` on kernel `version`: `quick_on` are
    /// the backends --quick runs it on, the tracepoint backend on the
    /// oldest kernel only (QUICK_TRACEPOINT_ON).
    fn runs_on(&self, bin: &str, backend: &str, quick_on: &[&str], version: &str) -> bool {
        let quick = quick_on.contains(&backend) && (backend != "tracepoint" || version == QUICK_TRACEPOINT_ON);
        self.runs(bin)
            && (self.backends.is_empty() || self.backends.iter().any(|b| b == backend))
            && (!self.quick || quick)
    }
}

/// The guest's script: each test binary with a filter, per backend.
fn script(p: &Paths, bins: &[(String, PathBuf)], sel: &Selection, version: &str) -> Result<PathBuf> {
    let exe = |name: &str| -> Result<String> {
        let b = bins.iter().find(|(n, _)| n == name).with_context(|| format!("no test binary {name}"))?;
        Ok(fs::canonicalize(&b.1)?.to_string_lossy().into_owned())
    };
    let cwd = std::env::current_dir()?;
    let mut s = format!(
        "# Written by cargo xtask vmtest; runs inside the guest.\n\
         cd {cwd}\nexport WB_TEST_SCALE={SCALE}\nfailed=0\n\
         echo \"vmtest: kernel $(uname -r)\"\n\
         t() {{ echo \"vmtest: == $*\"; \"$@\" --test-threads=1 --nocapture || {{ echo \"vmtest: FAILED $*\"; failed=1; }}; }}\n",
        cwd = cwd.display()
    );
    for backend in BACKENDS {
        for (bin, filter, _) in PER_BACKEND.iter().filter(|t| sel.runs_on(t.0, backend, t.2, version)) {
            s += &format!("WB_TEST_BACKEND={backend} t {} {filter}\n", exe(bin)?);
        }
    }
    let end = version == kernels::OLDEST || version == kernels::NEWEST;
    for (bin, every, ends) in ONCE.iter().filter(|t| sel.runs(t.0)) {
        s += &format!("t {} {}\n", exe(bin)?, if end { ends } else { every });
    }
    // The hooks' cost per write on this kernel, each backend against none
    // (not in --quick: under emulation its noise exceeds what it measures).
    // Not current_exe() itself: the workspace build above may have relinked
    // it (then /proc/self/exe reads "xtask (deleted)").
    if !sel.quick && sel.only.is_empty() {
        let xtask = std::env::current_exe()?.with_file_name("xtask");
        s += &format!("{} overhead || failed=1\n", xtask.display());
    }
    s += "exit $failed\n";
    let path = p.dir.join(format!("run-{version}.sh"));
    fs::write(&path, s)?;
    Ok(path)
}

/// --quick's kernels fetched and unpacked, before the run needs them
/// (`cargo xtask test` does it while the binaries build).
pub fn prepare_quick() -> Result<()> {
    let p = Paths::new()?;
    for version in QUICK_KERNELS {
        kernel(&p, version)?;
    }
    Ok(())
}

/// run the integration tests on Debian's stock kernels under qemu (TCG)
///
/// Runs the integration tests on Debian's stock kernels under qemu (TCG):
/// 5.10 (Debian 11's, the oldest supported), 6.1, 6.12 and 7.2 (sid), on the
/// fentry backend and on the tracepoint backend, the differential test on the
/// oldest and the newest.
#[derive(clap::Args, Debug, Default, PartialEq)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// fewer tests, most on fentry only, on the oldest kernel (what `test` runs)
    #[arg(long)]
    pub quick: bool,
    /// these kernels only (5.10, 6.1, 6.12, 7.2)
    #[arg(long, value_name = "V[,V...]", value_delimiter = ',', action = Set, value_parser = kernel_line)]
    pub kernel: Vec<&'static str>,
    /// these test binaries only
    #[arg(long, value_name = "TEST[,TEST...]", value_delimiter = ',', action = Set, value_parser = test_binary)]
    pub only: Vec<String>,
    /// this backend only
    #[arg(long, value_name = "fentry|tracepoint", value_delimiter = ',', action = Set,
          value_parser = clap::builder::PossibleValuesParser::new(BACKENDS))]
    pub backend: Vec<String>,
}

/// A kernel line's version (kernels::LINES), for --kernel.
pub(crate) fn kernel_line(v: &str) -> Result<&'static str, String> {
    kernels::line(v).map(|l| l.version).map_err(|e| e.to_string())
}

/// A test binary vmtest runs, for --only.
fn test_binary(t: &str) -> Result<String, String> {
    match PER_BACKEND.iter().any(|p| p.0 == t) || ONCE.iter().any(|o| o.0 == t) {
        true => Ok(t.to_owned()),
        false => Err(format!("vmtest runs no test {t:?}")),
    }
}

pub fn main(args: &Args) -> Result<()> {
    let sel = Selection { quick: args.quick, only: args.only.clone(), backends: args.backend.clone() };
    let versions = &args.kernel;
    let versions: Vec<&str> = match versions.is_empty() {
        true if sel.quick => QUICK_KERNELS.to_vec(),
        true => kernels::LINES.iter().map(|l| l.version).collect(),
        false => versions.clone(),
    };
    let bins = build()?;
    guests(&versions, &sel, &bins, &Console::Echo)
}

/// What the guests run, built, and the test binaries by name.
fn build() -> Result<Vec<(String, PathBuf)>> {
    need("qemu-system-x86_64", "qemu-system-x86")?;
    need("busybox", "busybox-static")?;
    need("cpio", "cpio")?;
    crate::cargo(&["build", "--workspace", "--bins"])?;
    test_binaries()
}

/// Where the guests' console and the run's own lines go.
enum Console {
    /// Printed as they come.
    Echo,
    /// Kept, and printed once the run ends: it runs beside the host tests.
    Kept(std::sync::Mutex<Vec<String>>),
}

impl Console {
    fn line(&self, line: String) {
        match self {
            Console::Echo => println!("{line}"),
            Console::Kept(lines) => lines.lock().unwrap().push(line),
        }
    }
}

/// --quick beside the host tests: built now, while cargo is free (`cargo
/// test` holds the build directory's lock until its last test ends), then
/// booted in a thread, qemu under SCHED_IDLE so that the host tests' own
/// processes are never kept waiting by it; the guest's disk bypasses the
/// host's page cache, whose dirty pages those tests measure.  The host
/// tests use about half of one of this machine's two cores, leaving the
/// rest to TCG.  Its console is kept until the run prints it (`print`), so that it
/// ends up at the end of the run's output, where CI's tail shows it.
pub fn quick_beside() -> Result<Beside> {
    let sel = Selection { quick: true, ..Default::default() };
    let bins = build()?;
    Ok(Beside(std::thread::spawn(move || {
        let console = Console::Kept(Default::default());
        let result = guests(QUICK_KERNELS, &sel, &bins, &console);
        let Console::Kept(lines) = console else { unreachable!() };
        (lines.into_inner().unwrap(), result)
    })))
}

/// The guest's run beside the host tests.
pub struct Beside(std::thread::JoinHandle<(Vec<String>, Result<()>)>);

impl Beside {
    /// Waits for the guest: its console and its outcome.
    pub fn wait(self) -> (Vec<String>, Result<()>) {
        self.0.join().unwrap_or_else(|_| (Vec::new(), Err(anyhow::anyhow!("vmtest panicked"))))
    }
}

/// A guest's kept console, printed.
pub fn print(lines: &[String]) {
    for line in lines {
        println!("{line}");
    }
}

/// Each kernel's guest, one after another.
fn guests(versions: &[&str], sel: &Selection, bins: &[(String, PathBuf)], console: &Console) -> Result<()> {
    let p = Paths::new()?;
    let mut outcomes = Vec::new();
    for &version in versions {
        let (vmlinuz, tree, release) = kernel(&p, version)?;
        let initrd = initramfs(&p, Path::new(&tree), &release)?;
        let script = script(&p, bins, sel, version)?;
        let scratch = p.dir.join("scratch.img");
        let _ = fs::remove_file(&scratch);
        fs::File::create(&scratch)?.set_len(SCRATCH_GIB << 30)?;

        console.line(format!("vmtest: booting {release} under qemu (TCG)"));
        let started = Instant::now();
        // A kept console is the run beside the host tests, at idle priority.
        let timeout = match (console, sel.quick) {
            (Console::Kept(_), _) => TIMEOUT_BESIDE,
            (Console::Echo, true) => TIMEOUT_QUICK,
            (Console::Echo, false) => TIMEOUT_FULL,
        };
        let b = Boot { vmlinuz: &vmlinuz, initrd: &initrd, script: &script, tree: &tree, scratch: &scratch, timeout };
        let (log, _) = guest::boot_retrying("vmtest: ", || boot(&b, &p, console))?;
        // The last exit line, as when it was read line by line.
        let exit = log
            .iter()
            .rev()
            .find_map(|l| l.trim().strip_prefix("vmtest: exit "))
            .and_then(|rc| rc.trim().parse::<i32>().ok());
        let _ = fs::remove_file(&scratch);
        let failed: Vec<String> =
            log.iter().filter_map(|l| l.split_once("vmtest: FAILED ")).map(|(_, t)| t.to_owned()).collect();
        let secs = started.elapsed().as_secs_f64();
        console.line(format!("vmtest: {release}: {secs:.0} s"));
        let status = match exit {
            Some(0) => "passed".to_owned(),
            Some(rc) => format!("FAILED (exit {rc}): {}", failed.join("; ")),
            None => format!("the guest stopped without reporting (crash or {} s timeout)", timeout.as_secs()),
        };
        outcomes.push((release, secs, exit == Some(0), status));
    }
    console.line("\nvmtest: summary".into());
    for (release, secs, _, status) in &outcomes {
        console.line(format!("  {release}: {secs:.0} s, {status}"));
    }
    if outcomes.iter().any(|o| !o.2) {
        let failed: Vec<String> = outcomes.iter().filter(|o| !o.2).map(|o| format!("{}: {}", o.0, o.3)).collect();
        bail!("tests failed in a guest: {}", failed.join("; "));
    }
    Ok(())
}

/// One guest's boot: its kernel, its initramfs, the script it runs.
struct Boot<'a> {
    vmlinuz: &'a Path,
    initrd: &'a Path,
    script: &'a Path,
    /// The kernel's unpacked tree (its modules).
    tree: &'a str,
    scratch: &'a Path,
    timeout: Duration,
}

/// One boot of the test kernel (qemu exits at the guest's power-off or
/// panic), its serial console to `console`; returns its lines.  The
/// scratch disk bypasses the host's page cache (O_DIRECT, flushes
/// ignored): what the guest writes is no dirty page of the host's.
fn boot(b: &Boot, p: &Paths, console: &Console) -> Result<Vec<String>> {
    let mut cmd = match console {
        Console::Echo => Command::new("timeout"),
        Console::Kept(_) => {
            let mut c = Command::new("chrt");
            c.args(["--idle", "0", "timeout"]);
            c
        }
    };
    let mut qemu = cmd
        .args(["--signal=KILL", &b.timeout.as_secs().to_string(), "qemu-system-x86_64"])
        .args(["-m", GUEST_MEM, "-smp", "2", "-accel", "tcg,thread=multi", "-cpu", "max"])
        .args(["-nographic", "-no-reboot", "-kernel"])
        .arg(b.vmlinuz)
        .arg("-initrd")
        .arg(b.initrd)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 quiet panic=-1 wbrun={} wbkernel={} wbkeep={}:{}",
            b.script.display(),
            b.tree,
            std::env::current_dir()?.display(),
            p.dir.parent().expect("target/vmtest").display()
        ))
        .args(["-virtfs", "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap"])
        .arg("-drive")
        .arg(format!("file={},if=virtio,format=raw,cache.direct=on,cache.no-flush=on", b.scratch.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting qemu")?;
    crate::guest::console(&mut qemu, |line, _| console.line(line.to_owned()))
}

/// `xtask overhead` (run in the guest by the script): ns per 4 KiB write()
/// to tmpfs without the daemon and with each backend, the median of 3
/// alternating runs.  Under TCG every instruction is emulated, so absolute
/// numbers are inflated; the ratios are what compares backends.
pub fn overhead(args: &[String]) -> Result<()> {
    let secs: f64 = args.first().map(|s| s.parse()).transpose()?.unwrap_or(2.0);
    // The debug build beside this binary, as the tests use: the BPF is the same.
    let daemon = std::env::current_exe()?.with_file_name("writebehindd");
    let modes = [None, Some("fentry"), Some("tracepoint")];
    let mut ns: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    for _ in 0..3 {
        for (i, backend) in modes.iter().enumerate() {
            let d = match backend {
                Some(b) => Some(wb_tests::Daemon::start_exe_with_args(&daemon, &["--backend", b])?),
                None => None,
            };
            let m = crate::bench::scenarios::overhead(secs)?;
            if let Some(d) = d {
                d.stop()?;
            }
            ns[i].push(m.iter().find(|(k, _)| *k == "ns/write").map(|(_, v)| *v).unwrap_or(f64::NAN));
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let base = median(&mut ns[0]);
    println!("overhead: 4 KiB write() to tmpfs on {}", fs::read_to_string("/proc/sys/kernel/osrelease")?.trim());
    println!("  {:<12} {:>10} {:>10} {:>8}", "backend", "ns/write", "+ns", "+%");
    for (i, backend) in modes.iter().enumerate() {
        let v = median(&mut ns[i]);
        println!("  {:<12} {v:>10.0} {:>10.0} {:>7.1}%", backend.unwrap_or("none"), v - base, (v / base - 1.0) * 100.0);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_runs_lifecycle_on_tracepoints_on_the_oldest_kernel_only() {
        let quick = Selection { quick: true, ..Default::default() };
        assert!(quick.runs_on("lifecycle", "tracepoint", BACKENDS, kernels::OLDEST));
        assert!(!quick.runs_on("lifecycle", "tracepoint", BACKENDS, kernels::NEWEST));
        assert!(quick.runs_on("lifecycle", "fentry", BACKENDS, kernels::NEWEST));
        assert!(!quick.runs_on("multi_file", "fentry", &[], kernels::OLDEST));
        let only =
            Selection { only: vec!["lifecycle".into()], backends: vec!["tracepoint".into()], ..Default::default() };
        assert!(only.runs_on("lifecycle", "tracepoint", FENTRY, "6.1"));
        assert!(!only.runs_on("lifecycle", "fentry", BACKENDS, "6.1"));
        assert!(!only.runs_on("single_stream", "tracepoint", BACKENDS, "6.1"));
    }
}
