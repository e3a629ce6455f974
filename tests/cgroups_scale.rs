//! A user creates cgroups by the ten thousand in the subtree systemd
//! delegated to them.  A system service's policy must still reach BPF, and
//! the daemon's every-second walk must stay cheap.

use std::time::Duration;

use anyhow::Result;
use wb_tests::*;

/// Cgroups the user makes: groups of 200 (mkdir with many arguments, one
/// process per group), so their directories are read as well as stat'ed.
const GROUPS: u32 = 100;
const PER_GROUP: u32 = 200;

#[test]
fn a_users_many_cgroups_cost_little_and_take_no_services_policy() -> Result<()> {
    require_root();
    let fs = Mounted::new(LoopDevice::new(256)?, "ext4")?;
    let tag = std::process::id();
    // Held in this order, dropped in reverse: children before parents.
    let system = Cgroup::at("/system.slice")?;
    let db = system.child(&format!("wb-test-{tag}-database.service"))?;
    let users = Cgroup::at("/user.slice")?;
    let user = users.child(&format!("wb-test-{tag}-user@65534.service"))?;
    user.delegate_to(65534)?;
    let made = format!(
        "cd {} && for g in $(seq {GROUPS}); do mkdir g$g && (cd g$g && mkdir $(seq -f c%g {PER_GROUP})) || exit 1; done",
        user.dir.display()
    );
    run(as_nobody("sh").arg("-c").arg(&made))?;
    let n = GROUPS * (PER_GROUP + 1);

    // Every user cgroup matches a pattern: nothing below /user.slice can be
    // skipped, the hard case for the walk (desktop.toml ships such a table).
    let policy = format!(
        "window = \"8MiB\"\nburst = \"1MiB\"\n\
         [[policy]]\ncgroup = \"{}\"\nmode = \"off\"\n\
         [[policy]]\ncgroup = \"/user.slice/**\"\nburst = \"4MiB\"\n",
        db.path
    );
    let mut daemon = Daemon::start_with_policy(&policy)?;
    std::thread::sleep(Duration::from_secs(1));
    let (before, secs) = (cpu_secs(daemon.pid())?, 5);
    std::thread::sleep(Duration::from_secs(secs));
    let share = (cpu_secs(daemon.pid())? - before) / secs as f64;
    println!("  {n} cgroups of user 65534: daemon CPU {:.1}% of a core over {secs} s", share * 100.0);

    // Policies reach BPF, not only the log: the service's writer is left
    // alone, a writer in the root cgroup is not.
    let off_pid = db.dd(&fs.path("off"), 64)?;
    let on_pid = Cgroup::at("/")?.dd(&fs.path("on"), 64)?;
    daemon.wait_log(&format!("pid={on_pid} "), Duration::from_secs(10))?;
    let log = daemon.stop()?;
    assert!(log.contains(&format!("cgroup={} ", db.path)), "the service's policy was not applied:\n{log}");
    assert!(!log.contains(&format!("pid={off_pid} ")), "the service's writer was acted on:\n{log}");
    let capped = log.matches("too many cgroups in a delegated subtree").count();
    assert_eq!(capped, 1, "the cap must be logged once, when it starts to bite:\n{log}");
    // Measured (debug build): 1.6-3.6%, most of it the events of other
    // processes; 51% when every cgroup was re-read every second.
    assert!(share < 0.10, "the daemon used {:.0}% of a core while {n} cgroups existed", share * 100.0);
    Ok(())
}
