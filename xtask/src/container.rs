//! cargo xtask container [--check]: the daemon's container image, made
//! without a registry, and (--check) the image run under podman with the
//! DaemonSet's privileges against a throttled loop device.
//!
//! The image is a tarball imported with `podman import`: the release
//! daemon and wbctl, the shared libraries `ldd` says they load (from the
//! build host), and empty directories for what the runtime mounts.  No
//! base image is pulled, so nothing needs a registry.
//!
//! PRIVILEGES is the one list of what the container is granted: podman's
//! arguments here are made from it, and --check also compares it with
//! deploy/kubernetes/daemonset.yaml's securityContext and volumes.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use wb_tests::{Background, BdiKnobs, LoopDevice, Mounted};

use crate::deb::{output, run, version};

const OUT: &str = "target/container";
pub const IMAGE: &str = "localhost/writebehindd";
pub const MANIFEST: &str = "deploy/kubernetes/daemonset.yaml";
const PYTHON: &str = "/usr/bin/python3";
/// Checks manifests against python3-kubernetes's models of the API.
const SCHEMA: &str = include_str!("container/schema.py");

/// The capabilities the container keeps, all others dropped: the unit's
/// CapabilityBoundingSet (systemd/writebehindd.service says why each).
pub const CAPABILITIES: [&str; 5] = ["BPF", "PERFMON", "SYS_PTRACE", "DAC_READ_SEARCH", "FOWNER"];

/// Host paths the container mounts at the same place, read-write unless
/// said: (path, read-only, why).
pub const HOST_PATHS: [(&str, bool, &str); 4] = [
    ("/sys", false, "the bdi knobs (/sys/class/bdi/*/max_bytes, strict_limit, ...) and /sys/dev/block"),
    ("/sys/kernel/tracing", true, "tracefs: the syscall tracepoints of the fallback backend"),
    ("/sys/fs/cgroup", true, "the host's cgroup tree: policies match writers' cgroups"),
    ("/run/writebehindd", false, "the journal of paced bdis, which the next start restores after a kill"),
];

/// What else the container is given, in podman's words, each with why.
/// hostPID: writers' files are reached through /proc/<pid>/fd, and the
/// host's mount table through /proc/1/mountinfo.  seccomp: the runtime's
/// default profile allows bpf(2) and perf_event_open(2) only with
/// CAP_SYS_ADMIN.  apparmor: its container profile denies writes under
/// /sys.  The rest as the DaemonSet says: hostNetwork (the metrics port),
/// readOnlyRootFilesystem, allowPrivilegeEscalation false.
pub const PODMAN_EXTRA: [&str; 7] = [
    "--pid=host",
    "--cgroupns=host",
    "--network=host",
    "--read-only",
    "--security-opt=no-new-privileges",
    "--security-opt=seccomp=unconfined",
    "--security-opt=apparmor=unconfined",
];

/// Resource limits podman may give without CAP_SYS_RESOURCE, which the
/// machine that measured this lacks: runc refused (EPERM) podman's own
/// defaults (nofile 1048576, nproc 4194304), and nproc at this process's
/// hard limit (96362; 65536 too), and started with nproc 32768.  nofile
/// and memlock are this process's hard limits.  A pod gets its runtime's
/// (containerd's unit: LimitNOFILE and LimitMEMLOCK infinity); kernels
/// before 5.11 charge BPF maps to memlock, which must then allow about
/// 17 MiB.
fn ulimits() -> Vec<String> {
    let hard = |which| {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: a valid resource and an rlimit we own.
        unsafe { libc::getrlimit(which, &mut r) };
        if r.rlim_max == libc::RLIM_INFINITY { "-1".to_owned() } else { r.rlim_max.to_string() }
    };
    let (nofile, memlock) = (hard(libc::RLIMIT_NOFILE), hard(libc::RLIMIT_MEMLOCK));
    vec![
        format!("--ulimit=nofile={nofile}:{nofile}"),
        "--ulimit=nproc=32768:32768".to_owned(),
        format!("--ulimit=memlock={memlock}:{memlock}"),
    ]
}

/// build (release) the container image localhost/writebehindd:<version>
#[derive(clap::Args, Debug, Default, PartialEq)]
pub struct Args {
    /// then run it (root, under the host lock): a host process's copy to a
    /// throttled loop device is paced, `podman stop` restores the knobs,
    /// `podman kill` leaves them to the next start, which restores them
    #[arg(long)]
    pub check: bool,
    /// with --check: pace through vm.dirty_bytes (--pacing-lever global,
    /// the lever of kernels before 6.2), /proc/sys unmasked for it
    #[arg(long, requires = "check")]
    pub global_lever: bool,
}

pub fn main(args: &Args) -> Result<()> {
    let start = Instant::now();
    crate::cargo(&["build", "--release", "-p", "writebehindd"])?;
    let tag = image()?;
    println!("container: image {tag} in {:.1} s", start.elapsed().as_secs_f64());
    if args.check {
        manifest_matches()?;
        check(&tag, args.global_lever)?;
        println!("container --check: passed in {:.1} s", start.elapsed().as_secs_f64());
    }
    Ok(())
}

/// Stages the image's tree, packs it and imports it: its tag.
fn image() -> Result<String> {
    let version = version()?;
    let stage = Path::new(OUT).join("root");
    if stage.exists() {
        fs::remove_dir_all(&stage)?;
    }
    let bins =
        [("usr/sbin/writebehindd", crate::release_bin("writebehindd")), ("usr/bin/wbctl", crate::release_bin("wbctl"))];
    for (dst, src) in &bins {
        copy(src, &stage.join(dst))?;
        run(Command::new("strip").args(["--remove-section=.comment", "--remove-section=.note"]).arg(stage.join(dst)))?;
        for lib in libraries(src)? {
            let dst = stage.join(lib.strip_prefix("/")?);
            if !dst.exists() {
                copy(&lib, &dst)?;
            }
        }
    }
    for dir in ["etc/writebehindd/policies.d", "run/writebehindd", "tmp", "proc", "sys", "dev"] {
        fs::create_dir_all(stage.join(dir))?;
    }
    fs::write(stage.join("etc/passwd"), "root:x:0:0:root:/:/usr/sbin/nologin\n")?;
    fs::write(stage.join("etc/group"), "root:x:0:\n")?;
    let tar = Path::new(OUT).join("image.tar");
    run(Command::new("tar")
        .args(["--owner=0", "--group=0", "--numeric-owner", "-C"])
        .arg(&stage)
        .arg("-cf")
        .arg(&tar)
        .arg("."))?;
    let tag = format!("{IMAGE}:{version}");
    let out = output(
        Command::new("podman")
            .arg("import")
            .arg("--change")
            .arg("ENTRYPOINT [\"/usr/sbin/writebehindd\"]")
            .arg("--change")
            .arg("LABEL org.opencontainers.image.title=writebehindd")
            .arg(&tar)
            .arg(&tag),
    )?;
    println!(
        "container: {} KiB imported as {tag} ({})",
        fs::metadata(&tar)?.len() / 1024,
        out.lines().last().unwrap_or("")
    );
    Ok(tag)
}

fn copy(src: &Path, dst: &Path) -> Result<()> {
    fs::create_dir_all(dst.parent().unwrap())?;
    fs::copy(src, dst).with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
    Ok(())
}

/// The shared objects a binary loads, by ldd: "libc.so.6 => /lib/... (0x...)"
/// and the loader's own line "/lib64/ld-linux-x86-64.so.2 (0x...)".
fn libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let text = output(Command::new("ldd").arg(bin))?;
    let mut libs = Vec::new();
    for line in text.lines() {
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    ensure!(libs.iter().any(|l| l.to_string_lossy().contains("libc.so")), "ldd {}: no libc:\n{text}", bin.display());
    Ok(libs)
}

/// podman's arguments for PRIVILEGES: the DaemonSet's grant.
pub fn podman_privileges() -> Vec<String> {
    let mut v = vec!["--cap-drop=all".to_owned()];
    v.extend(CAPABILITIES.iter().map(|c| format!("--cap-add=CAP_{c}")));
    for (path, ro, _) in HOST_PATHS {
        v.push(format!("--volume={path}:{path}:{}", if ro { "ro,rbind" } else { "rw,rbind" }));
    }
    v.extend(PODMAN_EXTRA.iter().map(|s| s.to_string()));
    v.extend(ulimits());
    v
}

/// The DaemonSet grants what PRIVILEGES lists: its capabilities, its
/// hostPath volumes at the same paths with the same read-only flags, and
/// hostPID; no `privileged: true`.
pub fn manifest_matches() -> Result<()> {
    let script = r#"
import json, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d.get("kind") == "DaemonSet"]
spec = docs[0]["spec"]["template"]["spec"]
c = [c for c in spec["containers"] if c["name"] == "writebehindd"][0]
vols = {v["name"]: v for v in spec.get("volumes", [])}
mounts = [{"path": m["mountPath"], "host": vols[m["name"]].get("hostPath", {}).get("path"),
           "ro": bool(m.get("readOnly", False))} for m in c.get("volumeMounts", [])]
sc = c.get("securityContext", {})
print(json.dumps({"hostPID": spec.get("hostPID", False), "hostNetwork": spec.get("hostNetwork", False),
                  "privileged": sc.get("privileged", False),
                  "readOnlyRootFilesystem": sc.get("readOnlyRootFilesystem", False),
                  "allowPrivilegeEscalation": sc.get("allowPrivilegeEscalation", True),
                  "seccomp": sc.get("seccompProfile", {}).get("type"),
                  "apparmor": docs[0]["spec"]["template"]["metadata"].get("annotations", {})
                      .get("container.apparmor.security.beta.kubernetes.io/writebehindd"),
                  "add": sc.get("capabilities", {}).get("add", []), "drop": sc.get("capabilities", {}).get("drop", []),
                  "mounts": mounts}))
"#;
    // Debian's python, whose packages (python3-yaml, python3-kubernetes)
    // these need, whatever python3 comes first on PATH.
    let out = output(Command::new(PYTHON).arg("-c").arg(script).arg(MANIFEST))?;
    let got: serde_json::Value = serde_json::from_str(&out)?;
    ensure!(got["hostPID"] == true, "{MANIFEST}: hostPID must be true");
    ensure!(got["privileged"] == false, "{MANIFEST}: privileged: the DaemonSet grants only PRIVILEGES");
    for (key, want) in [
        ("hostNetwork", serde_json::json!(true)),
        ("readOnlyRootFilesystem", serde_json::json!(true)),
        ("allowPrivilegeEscalation", serde_json::json!(false)),
        ("seccomp", serde_json::json!("Unconfined")),
        ("apparmor", serde_json::json!("unconfined")),
    ] {
        ensure!(got[key] == want, "{MANIFEST}: {key} is {}, PODMAN_EXTRA's is {want}", got[key]);
    }
    ensure!(got["drop"] == serde_json::json!(["ALL"]), "{MANIFEST}: capabilities.drop must be [ALL]: {}", got["drop"]);
    let mut add: Vec<String> =
        got["add"].as_array().into_iter().flatten().filter_map(|v| v.as_str().map(String::from)).collect();
    add.sort();
    let mut want: Vec<String> = CAPABILITIES.iter().map(|c| c.to_string()).collect();
    want.sort();
    ensure!(add == want, "{MANIFEST} adds capabilities {add:?}, xtask's CAPABILITIES are {want:?}");
    for (path, ro, _) in HOST_PATHS {
        let m = got["mounts"].as_array().into_iter().flatten().find(|m| m["path"] == path);
        let Some(m) = m else { bail!("{MANIFEST}: no volume mounted at {path}") };
        ensure!(m["host"] == path, "{MANIFEST}: {path} is not the host's {path}: {m}");
        ensure!(m["ro"] == ro, "{MANIFEST}: {path} readOnly should be {ro}");
    }
    let host_mounts = got["mounts"].as_array().into_iter().flatten().filter(|m| !m["host"].is_null()).count();
    ensure!(
        host_mounts == HOST_PATHS.len(),
        "{MANIFEST}: {host_mounts} hostPath mounts, xtask lists {}",
        HOST_PATHS.len()
    );
    let schema = Command::new(PYTHON).arg("-c").arg(SCHEMA).arg(MANIFEST).output()?;
    print!("{}", String::from_utf8_lossy(&schema.stdout));
    ensure!(
        schema.status.success(),
        "{MANIFEST} against the Kubernetes schema:\n{}",
        String::from_utf8_lossy(&schema.stderr)
    );
    println!(
        "container: {MANIFEST} grants what xtask's PRIVILEGES list ({} capabilities, {} host paths, hostPID)",
        CAPABILITIES.len(),
        HOST_PATHS.len()
    );
    Ok(())
}

const NAME: &str = "wb-container-check";
const METRICS: &str = "127.0.0.1:19477";

/// One container of the image with the DaemonSet's privileges, detached.
fn start(tag: &str, policies: &Path, global: bool) -> Result<()> {
    let _ = Command::new("podman").args(["rm", "-f", NAME]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    let mut cmd = Command::new("podman");
    cmd.args(["run", "-d", "--name", NAME]).args(podman_privileges());
    cmd.arg(format!("--volume={}:/etc/writebehindd/policies.d:ro", policies.display()));
    if global {
        // The container's /proc/sys is read-only, and runc refuses to
        // bind-mount anything inside /proc: the mask goes instead.
        cmd.arg("--security-opt=unmask=/proc/sys");
    }
    cmd.arg(tag).args(["--metrics-listen", METRICS]);
    if global {
        cmd.args(["--pacing-lever", "global"]);
    }
    output(&mut cmd)?;
    wait("the container's daemon to attach", Duration::from_secs(20), || Ok(logs()?.contains("attached")))
}

fn logs() -> Result<String> {
    let out = Command::new("podman").args(["logs", NAME]).output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

fn wait(what: &str, within: Duration, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + within;
    while !done()? {
        if Instant::now() > deadline {
            bail!("{what}: not within {} s; the container's log:\n{}", within.as_secs(), logs().unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// What the daemon paces with: the bdi's knobs, or the global limits.
struct Watched {
    global: bool,
    knobs: BdiKnobs,
}

const VM: [&str; 4] = ["dirty_bytes", "dirty_background_bytes", "dirty_ratio", "dirty_background_ratio"];

impl Watched {
    fn values(&self) -> Vec<String> {
        if self.global {
            VM.iter().map(|k| wb_tests::knob::read(&format!("/proc/sys/vm/{k}")).unwrap_or_default()).collect()
        } else {
            let (ratio, strict) = self.knobs.values();
            vec![ratio, strict]
        }
    }

    fn paced(&self) -> bool {
        if self.global {
            wb_tests::knob::read("/proc/sys/vm/dirty_bytes").is_ok_and(|v| v != "0")
        } else {
            self.knobs.get("strict_limit") == "1"
        }
    }

    fn wait_paced(&self, what: &str) -> Result<()> {
        wait(what, Duration::from_secs(10), || Ok(self.paced()))
    }

    fn put_back(&self, original: &[String]) {
        if self.global {
            // A ratio written zeroes its bytes twin and the other way
            // round: write whichever of each pair was in force.
            for (bytes, ratio) in [(0, 2), (1, 3)] {
                let (k, v) =
                    if original[bytes] != "0" { (VM[bytes], &original[bytes]) } else { (VM[ratio], &original[ratio]) };
                let _ = fs::write(format!("/proc/sys/vm/{k}"), v);
            }
        } else {
            let _ = fs::write(format!("{}/strict_limit", self.knobs.dir), &original[1]);
            let _ = fs::write(format!("{}/max_ratio_fine", self.knobs.dir), &original[0]);
        }
    }
}

/// A host process's copy to a throttled loop device (1 GiB at 150 MiB/s;
/// its whole pipeline killed when dropped).
fn copy_to(fs: &Mounted, name: &str) -> Result<Background> {
    Background::sh(&format!("head -c 1024M /dev/zero | pv -qL 150m > {}", fs.path(name).display()))
}

const PROMETHEUS: &str = "127.0.0.1:19090";
pub const DASHBOARD: &str = "deploy/grafana/writebehindd.json";

/// Debian's Prometheus, scraping the container's metrics every second into
/// a TSDB of its own under target/container; stopped when dropped.
fn prometheus() -> Result<Background> {
    let dir = std::env::current_dir()?.join(OUT).join("prometheus");
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir_all(&dir)?;
    let config = dir.join("prometheus.yml");
    fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: writebehindd\n    \
             static_configs:\n      - targets: [\"{METRICS}\"]\n"
        ),
    )?;
    let mut cmd = Command::new("prometheus");
    cmd.arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address={PROMETHEUS}"))
        .stdout(Stdio::null())
        .stderr(fs::File::create(dir.join("log"))?);
    // A process group of its own, which Background's drop kills.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    Background::spawn(&mut cmd)
}

/// GET on Prometheus's API: its "data".
fn api(path: &str, query: Option<&str>) -> Result<serde_json::Value> {
    let mut cmd = Command::new("curl");
    cmd.args(["-sf", "-G", &format!("http://{PROMETHEUS}/api/v1/{path}")]);
    if let Some(q) = query {
        cmd.args(["--data-urlencode", &format!("query={q}")]);
    }
    let out = cmd.output()?;
    ensure!(out.status.success(), "prometheus {path} {query:?}: curl {}", out.status);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    ensure!(v["status"] == "success", "prometheus {path} {query:?}: {v}");
    Ok(v["data"].clone())
}

/// The value of an instant query's first sample, if any.
fn value(query: &str) -> Result<Option<f64>> {
    let data = api("query", Some(query))?;
    Ok(data["result"].as_array().and_then(|r| r.first()).and_then(|s| s["value"][1].as_str()?.parse().ok()))
}

/// Every metric name a query of the dashboard names (or matches with
/// `__name__=~"..."`) is one the real Prometheus has after a scrape.
fn dashboard_names_scraped(names: &[String]) -> Result<usize> {
    let script = r#"
import json, re, sys
names = set(json.load(sys.stdin))
dash = json.load(open(sys.argv[1]))
exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
missing = []
for e in exprs:
    for pattern in re.findall(r'__name__=~"([^"]+)"', e):
        if not any(re.fullmatch(pattern, n) for n in names):
            missing.append(f"{pattern} (in {e})")
    for n in re.findall(r'writebehindd_[a-z_]+', re.sub(r'__name__=~"[^"]+"', "", e)):
        if n not in names:
            missing.append(f"{n} (in {e})")
print(len(exprs))
if missing:
    sys.exit("not scraped: " + "; ".join(missing))
"#;
    let mut child = Command::new(PYTHON)
        .arg("-c")
        .arg(script)
        .arg(DASHBOARD)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    serde_json::to_writer(child.stdin.take().unwrap(), names)?;
    let out = child.wait_with_output()?;
    ensure!(out.status.success(), "{DASHBOARD}: {}", String::from_utf8_lossy(&out.stderr).trim());
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

fn check(tag: &str, global: bool) -> Result<()> {
    ensure!(crate::is_root(), "container --check needs root (loop devices, BPF)");
    let t0 = Instant::now();
    let fs = Mounted::new(LoopDevice::throttled(1536, 60 << 20)?, "ext4")?;
    let bdi = fs.bdi()?;
    let watched = Watched { global, knobs: BdiKnobs::of(&fs)? };
    let original = watched.values();
    fs::create_dir_all("/run/writebehindd")?;
    let policies = std::env::current_dir()?.join(OUT).join("policies.d");
    fs::create_dir_all(&policies)?;
    let what = if global { format!("vm.{VM:?}") } else { "the bdi's [max_ratio_fine, strict_limit]".into() };
    println!("container: {bdi} (ext4 on a loop device capped at 60 MiB/s); {what} = {original:?}");
    let result = (|| -> Result<()> {
        // Paced, by a daemon in the container, as a disk.
        start(tag, &policies, global)?;
        let _prometheus = prometheus()?;
        let w = copy_to(&fs, "a")?;
        watched.wait_paced("the copy paced by the container's daemon")?;
        let status = output(Command::new("podman").args(["exec", NAME, "wbctl", "status", "--json"]))?;
        let status: serde_json::Value = serde_json::from_str(&status)?;
        let dev = status["devices"].as_array().into_iter().flatten().find(|d| d["bdi"] == bdi.as_str()).cloned();
        let dev = dev.context("wbctl status lists no such device")?;
        println!(
            "container: paced at {:.1} s: budget {} B, backing {}, name {}",
            t0.elapsed().as_secs_f64(),
            dev["paced_budget"],
            dev["backing"],
            dev["name"]
        );
        ensure!(dev["backing"] == "disk", "the host's loop device is a disk, not {}", dev["backing"]);
        let metrics = output(Command::new("curl").args(["-sf", &format!("http://{METRICS}/metrics")]))?;
        let line = metrics
            .lines()
            .find(|l| l.starts_with("writebehindd_device_paced{") && l.contains(&format!("bdi=\"{bdi}\"")));
        ensure!(line.is_some_and(|l| l.ends_with(" 1")), "metrics: the device paced:\n{}", line.unwrap_or("(absent)"));
        fs::write(Path::new(OUT).join("metrics.txt"), &metrics)?;
        // A real Prometheus has the copied device's dirty bytes and the
        // bytes written behind.
        let dirty = format!("writebehindd_device_dirty_bytes{{bdi=\"{bdi}\"}}");
        let behind = "writebehindd_flushed_bytes_total";
        wait(
            "Prometheus to scrape the device's dirty bytes and the bytes written behind",
            Duration::from_secs(15),
            || Ok(value(&dirty).ok().flatten().is_some() && value(behind).ok().flatten().is_some_and(|v| v > 0.0)),
        )?;
        let names: Vec<String> = serde_json::from_value(api("label/__name__/values", None)?)?;
        let queries = dashboard_names_scraped(&names)?;
        println!(
            "container: Prometheus at {:.1} s: {dirty} = {:.0}, {behind} = {:.0}; {} names scraped, all that {DASHBOARD}'s {queries} queries use among them",
            t0.elapsed().as_secs_f64(),
            value(&dirty)?.unwrap_or(0.0),
            value(behind)?.unwrap_or(0.0),
            names.len()
        );
        // podman stop: SIGTERM, the daemon restores the knobs itself.
        output(Command::new("podman").args(["stop", "-t", "20", NAME]))?;
        ensure!(
            watched.values() == original,
            "podman stop left {:?}, was {original:?}:\n{}",
            watched.values(),
            logs()?
        );
        println!("container: podman stop at {:.1} s: {what} restored", t0.elapsed().as_secs_f64());
        drop(w);
        // podman kill: SIGKILL, nothing restores; the next start does.
        start(tag, &policies, global)?;
        let w = copy_to(&fs, "a")?;
        watched.wait_paced("the second container's pacing")?;
        output(Command::new("podman").args(["kill", NAME]))?;
        drop(w);
        ensure!(watched.paced(), "a killed daemon cannot restore");
        start(tag, &policies, global)?;
        ensure!(
            watched.values() == original,
            "the next start left {:?}, was {original:?}:\n{}",
            watched.values(),
            logs()?
        );
        ensure!(logs()?.contains("left set by a previous run"), "the next start says what it restored:\n{}", logs()?);
        println!(
            "container: podman kill at {:.1} s: knobs left paced; the next start restored them",
            t0.elapsed().as_secs_f64()
        );
        output(Command::new("podman").args(["stop", "-t", "20", NAME]))?;
        Ok(())
    })();
    let _ = Command::new("podman").args(["rm", "-f", NAME]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    if watched.values() != original {
        // Whatever failed, the device and the sysctls are left as found.
        watched.put_back(&original);
    }
    result
}
