//! `cargo xtask vmtest`: the integration tests on a stock distribution
//! kernel, where fentry loads (this machine's kernel refuses it).
//!
//! KVM cannot run stock kernels here (/dev/kvm is kvm_pvm), so the guest
//! runs under qemu's TCG emulation: Debian's own linux-image package
//! (fetched with `apt-get download`, unpacked with `dpkg-deb -x`, modules
//! indexed with `depmod -b`), a busybox initramfs that mounts the host's
//! root read-only over 9p and chroots into it (xtask/vm/init), and a sparse
//! scratch disk for loop devices' backing files.  The guest runs the test
//! binaries the host built, once per backend, then the differential test.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::guest::{need, run};

const INIT: &str = include_str!("../vm/init");
/// The distribution kernel's metapackage: its dependency names the image.
const KERNEL_META: &str = "linux-image-amd64";
/// Modules the initramfs loads before the host's root is reachable.
const BOOT_MODULES: &[&str] = &["virtio_pci", "virtio_blk", "9pnet_virtio", "9p"];
const GUEST_MEM: &str = "6G";
const SCRATCH_GIB: u64 = 16;
/// The whole guest run (measured: about 4 min with --quick, 25 without);
/// CI's budget is 30 minutes for everything.
const TIMEOUT_QUICK: Duration = Duration::from_secs(12 * 60);
const TIMEOUT_FULL: Duration = Duration::from_secs(45 * 60);

/// Integration tests run in the guest on each backend: (test binary,
/// filter, also in --quick).  The rest need what the guest lacks (a blkio v1
/// cgroup to cap a device, systemd) or take too long under emulation.
const PER_BACKEND: &[(&str, &str, bool)] = &[
    ("single_stream", "excluded_writers_cause_no_flush", true),
    ("single_stream", "full_speed_dd_is_reported", false),
    ("single_stream", "exec_right_after_write_never_etxtbsy", false),
    ("multi_file", "temp_files_and_overwrites_are_written_once", false),
    ("multi_file", "tar_x_of_20000_files_is_held", false),
    ("reliability", "files_changed_under_a_stream_are_never_confused", false),
    ("lifecycle", "", true),
    ("mmap_and_io_uring", "mapped_and_io_uring_writes_are_seen", true),
];
/// --quick runs PER_BACKEND's quick ones on fentry only: the differential
/// test below covers the tracepoint backend on this kernel too.
const QUICK_BACKENDS: &[&str] = &["fentry"];
/// Run once: they choose backends themselves.
const ONCE: &[(&str, &str)] = &[("backends", "")];
/// Sizes of the guest's tests are divided by this (WB_TEST_SCALE): TCG
/// emulation writes ~10× slower than the host.
const SCALE: u32 = 8;

struct Paths {
    dir: PathBuf,
}

impl Paths {
    fn new() -> Result<Self> {
        let target = std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into());
        let dir = fs::canonicalize(&target)
            .with_context(|| format!("{}: build once first", Path::new(&target).display()))?
            .join("vmtest");
        fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }
}

/// The kernel tree (boot/vmlinuz-*, lib/modules/*), downloaded once.
fn kernel(p: &Paths) -> Result<(PathBuf, String)> {
    let deps = run(Command::new("apt-cache").args(["depends", KERNEL_META]))?;
    let image = deps
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends: ").filter(|d| d.starts_with("linux-image-")))
        .with_context(|| format!("apt-cache depends {KERNEL_META} names no linux-image"))?
        .to_owned();
    let release = image.trim_start_matches("linux-image-").to_owned();
    let root = p.dir.join(&image);
    let vmlinuz = root.join(format!("boot/vmlinuz-{release}"));
    if !root.join(format!("lib/modules/{release}/modules.dep")).exists() {
        println!("vmtest: fetching {image}");
        let dl = p.dir.join("download");
        let _ = fs::remove_dir_all(&dl);
        fs::create_dir_all(&dl)?;
        run(Command::new("apt-get").arg("download").arg(&image).current_dir(&dl))?;
        let deb = fs::read_dir(&dl)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|f| f.extension().is_some_and(|x| x == "deb"))
            .context("apt-get download left no .deb")?;
        let _ = fs::remove_dir_all(&root);
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
        run(Command::new("depmod").arg("-b").arg(&root).arg(&release))?;
        fs::remove_dir_all(&dl)?;
    }
    Ok((vmlinuz, root.to_string_lossy().into_owned()))
}

/// `modules` and what they depend on, dependencies first, by modules.dep
/// (each line: "path: the paths it needs, in load order reversed").
fn module_closure(tree: &Path, release: &str, modules: &[&str]) -> Result<Vec<PathBuf>> {
    let dir = tree.join(format!("lib/modules/{release}"));
    let dep = fs::read_to_string(dir.join("modules.dep"))?;
    let deps: HashMap<&str, Vec<&str>> =
        dep.lines().filter_map(|l| l.split_once(':')).map(|(p, d)| (p, d.split_whitespace().collect())).collect();
    let mut order: Vec<&str> = Vec::new();
    for m in modules {
        let file = format!("/{m}.ko");
        let path = *deps.keys().find(|p| p.ends_with(&file)).with_context(|| format!("no module {m} in {release}"))?;
        // modules.dep lists every indirect dependency too, the deepest last.
        for d in deps[path].iter().rev().chain([&path]) {
            if !order.contains(d) {
                order.push(d);
            }
        }
    }
    Ok(order.into_iter().map(|p| dir.join(p)).collect())
}

/// busybox, the boot modules and the init script, as a newc cpio archive.
fn initramfs(p: &Paths, tree: &Path, release: &str) -> Result<PathBuf> {
    let root = p.dir.join("initramfs");
    let _ = fs::remove_dir_all(&root);
    for d in ["bin", "mods", "proc", "sys", "dev", "host"] {
        fs::create_dir_all(root.join(d))?;
    }
    fs::copy("/bin/busybox", root.join("bin/busybox")).context("/bin/busybox: install busybox-static")?;
    let mut names = Vec::new();
    for m in module_closure(tree, release, BOOT_MODULES)? {
        let file = m.file_name().unwrap().to_string_lossy().into_owned();
        fs::copy(&m, root.join("mods").join(&file))?;
        names.push(file.trim_end_matches(".ko").to_owned());
    }
    fs::write(root.join("modules"), names.join("\n"))?;
    fs::write(root.join("init"), INIT)?;
    run(Command::new("chmod").arg("+x").arg(root.join("init")).arg(root.join("bin/busybox")))?;
    let out = p.dir.join("initramfs.cpio");
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

/// The guest's script: each test binary with a filter, per backend.
fn script(p: &Paths, bins: &[(String, PathBuf)], quick: bool) -> Result<PathBuf> {
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
    let backends: &[&str] = if quick { QUICK_BACKENDS } else { &["fentry", "tracepoint"] };
    for backend in backends {
        for (bin, filter, _) in PER_BACKEND.iter().filter(|t| t.2 || !quick) {
            s += &format!("WB_TEST_BACKEND={backend} t {} {filter}\n", exe(bin)?);
        }
    }
    for (bin, filter) in ONCE {
        s += &format!("t {} {filter}\n", exe(bin)?);
    }
    // The hooks' cost per write on this kernel, each backend against none
    // (not in --quick: under emulation its noise exceeds what it measures).
    // Not current_exe() itself: the workspace build above may have relinked
    // it (then /proc/self/exe reads "xtask (deleted)").
    if !quick {
        let xtask = std::env::current_exe()?.with_file_name("xtask");
        s += &format!("{} overhead || failed=1\n", xtask.display());
    }
    s += "exit $failed\n";
    let path = p.dir.join("run.sh");
    fs::write(&path, s)?;
    Ok(path)
}

pub fn main(args: &[String]) -> Result<()> {
    let quick = match args {
        [] => false,
        [q] if q == "--quick" => true,
        _ => bail!("usage: cargo xtask vmtest [--quick]"),
    };
    need("qemu-system-x86_64", "qemu-system-x86")?;
    need("busybox", "busybox-static")?;
    need("cpio", "cpio")?;
    let p = Paths::new()?;
    let (vmlinuz, tree) = kernel(&p)?;
    let release = vmlinuz.file_name().unwrap().to_string_lossy().trim_start_matches("vmlinuz-").to_owned();
    let initrd = initramfs(&p, Path::new(&tree), &release)?;
    crate::cargo(&["build", "--workspace", "--bins"])?;
    let script = script(&p, &test_binaries()?, quick)?;
    let scratch = p.dir.join("scratch.img");
    let _ = fs::remove_file(&scratch);
    fs::File::create(&scratch)?.set_len(SCRATCH_GIB << 30)?;

    println!("vmtest: booting {release} under qemu (TCG)");
    let started = Instant::now();
    let timeout = if quick { TIMEOUT_QUICK } else { TIMEOUT_FULL };
    let (log, _) =
        crate::guest::boot_retrying("vmtest: ", || boot(&vmlinuz, &initrd, &script, &tree, &p, &scratch, timeout))?;
    // The last exit line, as when it was read line by line.
    let exit = log
        .iter()
        .rev()
        .find_map(|l| l.trim().strip_prefix("vmtest: exit "))
        .and_then(|rc| rc.trim().parse::<i32>().ok());
    let _ = fs::remove_file(&scratch);
    println!("vmtest: {:.0} s", started.elapsed().as_secs_f64());
    match exit {
        Some(0) => Ok(()),
        Some(rc) => bail!("tests failed in the guest (exit {rc})"),
        None => bail!("the guest stopped without reporting (crash or {} s timeout)", timeout.as_secs()),
    }
}

/// One boot of the test kernel (qemu exits at the guest's power-off or
/// panic), echoing the serial console; returns its lines.
fn boot(
    vmlinuz: &Path,
    initrd: &Path,
    script: &Path,
    tree: &str,
    p: &Paths,
    scratch: &Path,
    timeout: Duration,
) -> Result<Vec<String>> {
    let mut qemu = Command::new("timeout")
        .args(["--signal=KILL", &timeout.as_secs().to_string(), "qemu-system-x86_64"])
        .args(["-m", GUEST_MEM, "-smp", "2", "-accel", "tcg,thread=multi", "-cpu", "max"])
        .args(["-nographic", "-no-reboot", "-kernel"])
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 quiet panic=-1 wbrun={} wbkernel={tree} wbkeep={}:{}",
            script.display(),
            std::env::current_dir()?.display(),
            p.dir.parent().expect("target/vmtest").display()
        ))
        .args(["-virtfs", "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap"])
        .arg("-drive")
        .arg(format!("file={},if=virtio,format=raw,cache=unsafe", scratch.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting qemu")?;
    crate::guest::console(&mut qemu, |_, _| {})
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
