#!/bin/bash
# The system test of `cargo xtask systest`, run as root inside the Debian
# guest (systemd as PID 1) by wb-systest.service from the read-only disk
# mounted at /run/systest, which also holds what to install: a .deb
# (writebehindd.deb) or, with --no-deb, the binaries and the unit (files/).  Each result is one line on the serial console:
#   systest: PASS|FAIL|SKIP <check> [detail]    systest: MEASURE <what> <value>
# The host counts them; the unit prints "systest: exit N" after this.
# Two boots: the first installs, enables and starts the service, then exits
# 100, which makes the unit reboot instead of powering off (the snapshot
# overlay keeps the root's changes across it); the second checks the
# service came up at boot by itself and goes on with the rest.
set -u
S=/run/systest
# shellcheck source=/dev/null
# WATCH: seconds the service must run without a restart; USB: quick|full;
# USB_DEFAULT_ON: the kernel line (all, or none) that copies with the kernel
# default too; ONLY: usb, db or nfs runs only that part of the second boot; DB:
# 1 runs the database beside a copy (db.sh); STICK_BPS: the sticks' write
# throttle; NFS: quick|full; NFS_ON: the kernel line (or all) that runs the
# NFS part (nfs.sh); LIFE_ON: the kernel lines (space-separated, or all)
# whose second boot checks the service's life (journal, policies, watch,
# kill -9, access, the fallback backend) before the sticks; the others go
# from the boot checks to the sticks; USB_ON: the kernel lines that copy to
# the sticks (usb.sh).
. $S/config
MAX_EXPOSURE=2.0
# Random data the host made (systest.rs, sources): 96 MiB for the service's
# writers, the file written during the kill among them; the sticks' and
# NFS's big file and photo folder.
SRCS=$S/sources
SRC_FILE=$SRCS/src.bin
failed=0
pass() { echo "systest: PASS $*"; }
fail() {
    echo "systest: FAIL $*"
    failed=1
}
skip() { echo "systest: SKIP $*"; }
measure() { echo "systest: MEASURE $*"; }
check() {
    local name=$1
    shift
    if "$@"; then pass "$name"; else fail "$name"; fi
}
prop() { systemctl show -p "$1" --value writebehindd; }
log() { journalctl -b -u writebehindd -o cat --no-pager; }
now_us() { echo $(($(date +%s%N) / 1000)); }
# Polls `cmd` (a command or function, run afresh each time: arguments are
# expanded once) every 0.2 s for up to $1 seconds.
wait_for() {
    local secs=$1
    shift
    local end=$(($(date +%s) + secs))
    until "$@"; do
        (($(date +%s) >= end)) && return 1
        sleep 0.2
    done
}
# Seconds from `date +%s%N` $1 to $2.
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b - a) / 1e9 }'; }
# The USB disks the guest sees now (sda, sdb...).
usb_disks() {
    local d
    for d in /sys/block/sd*; do
        [ -e "$d" ] && case $(readlink -f "$d") in */usb*) echo "${d##*/}" ;; esac
    done
}
# The first USB disk, once there (usb-storage scans its disk asynchronously).
first_usb_disk() {
    has_usb_disk() { [ -n "$(usb_disks)" ]; }
    wait_for 30 has_usb_disk
    udevadm settle -t 30
    usb_disks | head -1
}
logged() { log | grep -q -- "$1"; }
# The service's log since `date +%s` read $1.
log_since() { journalctl -u writebehindd --since "@$1" -o cat --no-pager; }
# Logged since `date +%s` read $1.
logged_since() { log_since "$1" | grep -q -- "$2"; }

STATE=/var/lib/wb-systest
# Every bdi's limits (max_bytes reads back as a share of a moving limit:
# max_ratio_fine is what holds the ceiling).
knobs() {
    grep -H . /sys/class/bdi/*/{strict_limit,max_ratio,min_ratio,max_ratio_fine} \
        /proc/sys/vm/dirty_{bytes,ratio,background_bytes,background_ratio} 2>/dev/null
}
# The knobs of `expected` (knobs' output) as they read now: a bdi that
# appeared since (sr0's, 11:0, shows up during the test) is not compared,
# nor one that is gone (the USB stick pulled out).
knobs_now() {
    local line
    while read -r line; do
        [ -e "${line%:*}" ] || continue
        echo "${line%:*}:$(cat "${line%:*}" 2>/dev/null)"
    done <<<"$1"
}
# `expected` without the bdis that are gone.
knobs_still() {
    local line
    while read -r line; do [ -e "${line%:*}" ] && echo "$line"; done <<<"$1"
}
# Knobs as `expected`, else the difference, in the log.
knobs_are() {
    local name=$1 expected=$2
    expected=$(knobs_still "$expected")
    if [ "$(knobs_now "$expected")" = "$expected" ]; then pass "$name"; else
        fail "$name"
        diff <(echo "$expected") <(knobs_now "$expected") | sed 's/^/systest:   /'
    fi
}
# The workload's filesystem: a loop device, as the host tests use, made before
# the install so that its knobs' values before install are known (and attached
# again after the reboot).  With direct I/O, so that what it writes goes to
# the root disk instead of dirtying the root filesystem's cache a second time,
# where it would count against the global dirty limit as the workload's own
# dirty pages do (a real second disk has no such twin).
workload_fs() {
    loop=$(losetup -f --show --direct-io=on /var/tmp/wb.img)
    mkdir -p /mnt/wb
    mount "$loop" /mnt/wb
    bdi=/sys/class/bdi/$(mountpoint -d /mnt/wb)
    # Every kernel paces: through the bdi's own knobs (6.2+), else through
    # the global dirty limits.
    if [ -e "$bdi/max_bytes" ]; then lever=bdi; else lever=global; fi
    paces=1
}
# Whether the daemon paces the device of bdi directory $1: its own
# strict_limit (6.2+), else the global limit in bytes (the administrator's
# ratio mode reads dirty_bytes 0).
paced() {
    if [ "$lever" = bdi ]; then [ "$(cat "$1/strict_limit")" = 1 ]; else [ "$(cat /proc/sys/vm/dirty_bytes)" != 0 ]; fi
}
# Dirty + writeback, KiB: of bdi $1 (debugfs), or of the whole guest
# (/proc/meminfo) for "-".
dirty_kib() {
    local k v u n=0
    if [ "$1" = - ]; then
        while read -r k v u; do
            case $k in Dirty: | Writeback:) n=$((n + v)) ;; esac
        done </proc/meminfo
    else
        while read -r k v u; do
            case $k in BdiReclaimable: | BdiWriteback:) n=$((n + v)) ;; esac
        done <"/sys/kernel/debug/bdi/$1/stats"
    fi
    echo $n
}
# peaks FILE A B: samples dirty_kib of A and of B every 0.1 s until
# killed, and keeps their peaks so far in FILE, "<A's> <B's>" (KiB).
peaks() {
    local a b pa=0 pb=0
    echo "0 0" >"$1"
    while :; do
        a=$(dirty_kib "$2") b=$(dirty_kib "$3")
        if ((a > pa || b > pb)); then
            ((a > pa)) && pa=$a
            ((b > pb)) && pb=$b
            echo "$pa $pb" >"$1"
        fi
        sleep 0.1
    done
}
# The daemon's counters line from `wbctl status` ("name=value ...").
counters() { wbctl status 2>/dev/null | sed -n 's/^counters: //p'; }
# counter <name> <counters line>: its value, 0 if absent.
counter() {
    local v
    v=$(tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p")
    echo "${v:-0}"
}
# How much counter <name> grew from <before> to <after>.
grew() { echo $(($(counter "$1" "$3") - $(counter "$1" "$2"))); }
not_running() {
    echo "systest: the service is not running; the boot's journal:"
    journalctl -b --no-pager -n 200 | sed 's/^/systest:   /'
    exit 1
}

if [ ! -e $STATE/installed ]; then
echo "systest: kernel $(uname -r), $(. /etc/os-release && echo "$PRETTY_NAME"), $(systemctl --version | head -1)"
check "pid1-is-systemd" [ "$(cat /proc/1/comm)" = systemd ]
check "cgroup2-unified" [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]
# systemd-analyze waits for the whole boot, which ends with this test:
# multi-user.target's activation, in µs since the kernel started.
measure boot-to-multi-user "$(($(systemctl show -p ActiveEnterTimestampMonotonic --value multi-user.target) / 1000)) ms"

truncate -s 1G /var/tmp/wb.img
mkfs.ext4 -q -F /var/tmp/wb.img
workload_fs
mkdir -p $STATE
knobs >$STATE/before-install

# Install.
if [ -f $S/writebehindd.deb ]; then
    # (not --no-download: apt 2.6 then fails with "Internal Error, Pathname
    # to install is not absolute"; the guest has no network anyway)
    check "apt-install-local-deb" apt-get install -y -q $S/writebehindd.deb
else
    skip "apt-install-local-deb" "--no-deb: binaries and unit copied"
    install -m 755 $S/files/writebehindd $S/files/wbctl /usr/local/bin/
    install -m 644 $S/files/writebehindd.service /etc/systemd/system/
    systemctl daemon-reload
fi

# Enable and start; Type=notify: `systemctl start` returns at READY=1.
t0=$(now_us)
systemctl enable --now writebehindd
t1=$(now_us)
check "active-running" [ "$(prop ActiveState)/$(prop SubState)" = active/running ]
check "type-notify" [ "$(prop Type)" = notify ]
start=$(prop ExecMainStartTimestampMonotonic)
ready=$(prop ActiveEnterTimestampMonotonic)
measure start-to-ready "$(((ready - start) / 1000)) ms (exec to READY=1; enable --now took $(((t1 - t0) / 1000)) ms)"
check "ready-reached" [ "$ready" -gt "$start" ]
check "fentry-backend" logged "backend=fentry"
# The unit bounds the daemon's descriptors (LimitNOFILE=) to what its stream
# cap needs: no more, and not less (the daemon would warn).
check "descriptors-bounded-by-the-unit" [ "$(prop LimitNOFILE)" -le 65536 ]
check "descriptors-enough-for-every-stream" eval '! logged "RLIMIT_NOFILE is low"'
[ "$(prop MainPID)" = 0 ] && not_running
touch $STATE/installed
if ((failed)); then
    echo "systest: the service's journal:"
    log | tail -30 | sed 's/^/systest:   /'
    exit 1
fi
umount /mnt/wb
exit 100
fi

# The second boot: the service was enabled, so it started by itself.
workload_fs
check "workload-disk-direct-io" [ "$(cat /sys/block/"${loop#/dev/}"/loop/dio)" = 1 ]
check "started-at-boot" [ "$(prop ActiveState)/$(prop SubState)/$(prop UnitFileState)" = active/running/enabled ]
[ "$(prop MainPID)" = 0 ] && not_running
start=$(prop ExecMainStartTimestampMonotonic)
ready=$(prop ActiveEnterTimestampMonotonic)
measure boot-to-ready "$((ready / 1000)) ms from the kernel's start (exec to READY=1 $(((ready - start) / 1000)) ms; multi-user.target at $(($(systemctl show -p ActiveEnterTimestampMonotonic --value multi-user.target) / 1000)) ms)"
check "fentry-backend-at-boot" logged "backend=fentry"
pid=$(prop MainPID)
on_line() { local l; for l in $1; do [ "$l" = all ] || [[ $(uname -r) == "$l"[.+-]* ]] && return 0; done; return 1; }
if [ -z "$ONLY" ] && ! on_line "$LIFE_ON"; then
    skip "service-life" "quick: on $LIFE_ON only (whose newest has this kernel's Debian and systemd)"
    ONLY=usb
fi
if [ -n "$ONLY" ]; then
    # shellcheck source=/dev/null
    . "$S/$ONLY.sh"
    umount /mnt/wb
    losetup -d "$loop"
    exit $failed
fi

# A streaming writer: stream started/ended, pacing on/off (through the
# bdi's knobs on 6.2+, the global dirty limits before); then a reload.  pv reads a file:
# from a pipe it writes with splice(2), which the daemon does not see (no
# stream for `head -c 160M /dev/zero | pv -qL 16m`, measured on 6.12).
pv -qL 16m $SRC_FILE >/mnt/wb/stream
sync
wait_for 30 logged "stream ended"
check "journal-stream-started" logged "stream started"
check "journal-stream-ended" logged "stream ended"
if ((paces)); then
    check "journal-pacing-on" logged "pacing on"
    check "journal-pacing-off" wait_for 30 logged "pacing off"
else
    skip "journal-pacing" "$(uname -r) has no per-bdi max_bytes (6.2+): nothing to pace with"
fi
systemctl reload writebehindd
check "journal-reload" wait_for 20 logged "policies reloaded"

# A user's disk image, attached and mapped as udisks does for an encrypted
# one (dm over a loop device over the user's file), then written by the
# user: whose data the dm device holds is found through its slaves and the
# loop device's backing file, so it steers no limit (no strict_limit on its
# bdi, or no vm.dirty_bytes on 6.1), and `wbctl status` names the file's
# owner.  The host has no device-mapper: tests/steering.rs covers the loop
# and fuseblk layers there.
truncate -s 512M /var/tmp/users.img
chown 65534:65534 /var/tmp/users.img
uloop=$(losetup -f --show /var/tmp/users.img)
modprobe dm_mod 2>/dev/null
echo "0 $(blockdev --getsz "$uloop") linear $uloop 0" | dmsetup create wb-users
mkfs.ext4 -q -F /dev/mapper/wb-users
mkdir -p /mnt/users
mount /dev/mapper/wb-users /mnt/users
chown 65534:65534 /mnt/users
users_bdi=$(mountpoint -d /mnt/users)
users_paced=0
# Capped: its own strict_limit, or under the global lever (6.1) a cap the
# daemon counts for it.  vm.dirty_bytes alone does not say which device
# set it: the loop device's writes land in its backing file on the root
# disk, which may be paced as the administrator's (a 6.1 run found
# dirty_bytes set during this write; the devices then were logged below).
users_capped() {
    if [ "$lever" = bdi ]; then
        paced /sys/class/bdi/"$users_bdi"
    else
        wbctl devices 2>/dev/null | grep "^$users_bdi " | grep -q " cap "
    fi
}
global_seen=0
setpriv --reuid=65534 --regid=65534 --clear-groups dd if=/dev/zero of=/mnt/users/f bs=1M count=256 status=none &
users_dd=$!
# The write and the 2 s a device stays paced after its last writer.
for _ in $(seq 40); do
    users_capped && users_paced=1
    if [ "$lever" != bdi ] && ((global_seen == 0)) && paced -; then
        global_seen=1
        wbctl devices 2>/dev/null | sed 's/^/systest:   global limit set while the user writes: /'
    fi
    sleep 0.2
done
wait $users_dd
users_named() { wbctl status 2>/dev/null | grep "^$users_bdi " | grep -q "uid 65534's file"; }
check "dm-over-a-users-image-steers-no-limit" [ $users_paced = 0 ]
check "dm-over-a-users-image-is-the-users" wait_for 10 users_named
umount /mnt/users
dmsetup remove wb-users
losetup -d "$uloop"
rm -f /var/tmp/users.img

# A writer in a transient unit: `wbctl units` counts what was written
# behind for it, and the journal finds its stream by field.  64 MiB, as a
# backup job would write; the stream's first window is enough.
systemd-run --quiet --wait --unit=wb-backup-test -p Type=oneshot \
    dd if=/dev/zero of=/mnt/wb/backup bs=1M count=64 status=none
sync
backup_unit() { wbctl units --json 2>/dev/null | tr -d ' \n' | grep -o '{[^{}]*"unit":"wb-backup-test.service"[^{}]*}'; }
backup_written() {
    local b
    b=$(backup_unit | grep -o '"written_behind_bytes":[0-9]*' | cut -d: -f2)
    [ "${b:-0}" -gt 0 ]
}
check "units-backup-written-behind" wait_for 10 backup_written
journal_unit() { journalctl -b -u writebehindd WRITER_UNIT=wb-backup-test.service -o cat --no-pager | grep -q "stream started"; }
check "journal-writer-unit-field" wait_for 10 journal_unit
rm -f /mnt/wb/backup

# Policies against real services: a drop-in for two units, picked up by a
# reload; a backup service is held to its own window, a database's writer
# is left alone, `wbctl policy --pid` names the table that applies; a broken
# drop-in is logged with its file and line, and the policy stays.
D=/etc/writebehindd/policies.d
mkdir -p $D # --no-deb: no package made it
cat >$D/50-systest.toml <<'TOML'
[[policy]]
cgroup = "/system.slice/backup.service"
window = "16MiB"

[[policy]]
cgroup = "/system.slice/database.service"
mode = "off"
TOML
# The log is read from the second $t begins: the unit test's dd above wrote
# /mnt/wb/backup too, and its "stream ended" with the same inode number
# (12 spans) was taken for this one's when logged in that second.
sleep 1
t=$(date +%s)
systemctl reload writebehindd
check "reload-picks-up-drop-in" wait_for 20 logged_since "$t" "policies reloaded.*50-systest.toml"
head -c 64M $SRC_FILE >/var/tmp/part
systemd-run -q --unit=backup sh -c 'pv -qL 16m /var/tmp/part >/mnt/wb/backup'
sleep 1
policy=$(wbctl policy --pid "$(systemctl show -p MainPID --value backup)")
check "wbctl-policy-names-the-service" grep -q 'backup.service' <<<"$policy"
wait_for 30 logged_since "$t" "stream ended.*ino=$(stat -c %i /mnt/wb/backup) "
# 64 MiB in 16 MiB windows, the first one after the 16 MiB burst: 3-4
# spans, where the root policy's window (0.03 s of bandwidth, 2 MiB or
# more) gives far more.
spans=$(log_since "$t" | grep "stream ended.*ino=$(stat -c %i /mnt/wb/backup) " | sed -n 's/.*spans=\([0-9]*\).*/\1/p' | tail -1)
measure backup-spans "${spans:-none} (64 MiB, window 16 MiB)"
check "backup-held-to-its-window" [ "${spans:-0}" -ge 2 -a "${spans:-99}" -le 5 ]
# A new cgroup gets its policy at the daemon's next walk (every second):
# the writer starts 2 s in (CI saw a database that wrote at once streamed
# under the root policy on 6.1).
systemd-run -q --unit=database --wait sh -c 'sleep 2; pv -qL 32m /var/tmp/part >/mnt/wb/db' >/dev/null
sleep 1
not_logged_since() { ! logged_since "$@"; }
check "database-left-alone" not_logged_since "$t" "stream started.*ino=$(stat -c %i /mnt/wb/db) "
printf 'burst = "lots"\n' >$D/60-broken.toml
t=$(date +%s)
systemctl reload writebehindd
check "broken-drop-in-logged-with-file-and-line" wait_for 20 logged_since "$t" "60-broken.toml: TOML parse error at line 1"
check "old-policy-stays" grep -q 'backup.service' <<<"$(wbctl policy --cgroup /system.slice/backup.service)"
rm -f $D/50-systest.toml $D/60-broken.toml /mnt/wb/backup /mnt/wb/db /var/tmp/part
systemctl reload writebehindd

# Observe only: the root policy at mode "observe", as an administrator
# tries it first.  A copy beyond the burst changes no knob (sampled while
# it runs and while pacing would linger), `wbctl status` says observe and
# what it would have written.  48 MiB at 32 MiB/s: 1.5 s of copy.
printf 'mode = "observe"\n' >$D/40-observe.toml
t=$(date +%s)
systemctl reload writebehindd
if wait_for 20 logged_since "$t" "policies reloaded.*40-observe.toml"; then
    before_observe=$(knobs)
    head -c 48M $SRC_FILE >/var/tmp/part
    pv -qL 32m /var/tmp/part >/mnt/wb/observed &
    copier=$!
    moved=0
    for _ in $(seq 20); do
        [ "$(knobs_now "$(knobs_still "$before_observe")")" = "$(knobs_still "$before_observe")" ] || moved=1
        sleep 0.2
    done
    wait $copier
    check "observe-changes-no-knob" [ $moved = 0 ]
    knobs_are "observe-knobs-after" "$before_observe"
    st=$(wbctl status)
    check "observe-status-says-observe" grep -q '^mode: observe' <<<"$st"
    would=$(sed -n 's/.* would_write_bytes=\([0-9]*\).*/\1/p' <<<"$st")
    measure observe-would-write "${would:-none} bytes (48 MiB, 16 MiB of burst)"
    check "observe-would-write" [ "${would:-0}" -gt 0 ]
else
    fail "observe-policy-accepted"
fi
rm -f $D/40-observe.toml /mnt/wb/observed /var/tmp/part
systemctl reload writebehindd

# The watchdog (WatchdogSec) must not fire: the same process for WATCH s
# since READY (monotonic µs, as /proc/uptime counts them here).
rest=$((WATCH - ($(cut -d. -f1 /proc/uptime) - ready / 1000000)))
((rest > 0)) && sleep $rest
check "no-restart-${WATCH}s" [ "$(prop NRestarts)/$(prop MainPID)/$(prop ActiveState)" = "0/$pid/active" ]

# kill -9 while pacing a writer: systemd restarts the daemon, the new one
# puts back the knobs the killed one paced with, the file is intact.
before_kill=$(knobs)
pv -qL 6m $SRC_FILE >/mnt/wb/copy &
writer=$!
strict() { paced "$bdi"; }
if ((paces)); then
    check "paced-before-kill" wait_for 30 strict
else
    sleep 4
fi
killed_s=$(date +%s)
kill -9 "$pid"
killed_at=$(now_us)
restarted() {
    local p
    p=$(prop MainPID)
    [ "$p" != "$pid" ] && [ "$p" != 0 ] && [ "$(prop ActiveState)" = active ]
}
wait_for 60 restarted
measure restart "$((($(prop ActiveEnterTimestampMonotonic) - $(prop ExecMainStartTimestampMonotonic)) / 1000)) ms to READY; active $((($(now_us) - killed_at) / 1000)) ms after the kill"
check "restarted-after-kill" [ "$(prop NRestarts)/$(prop ActiveState)/$(prop SubState)" = 1/active/running ]
if ((paces)); then
    check "knobs-restored-by-next-start" logged_since "$killed_s" "killed daemon left journaled: restored"
fi
wait "$writer"
sync
echo 3 >/proc/sys/vm/drop_caches
check "file-written-across-kill-identical" cmp $SRC_FILE /mnt/wb/copy
# The new instance does not pick the writer up again (measured on 6.12: no
# stream started for the 60 MiB pv wrote after the restart); if it did,
# its pacing ends before the knobs are compared.
if logged_since "$killed_s" "pacing on"; then wait_for 30 logged_since "$killed_s" "pacing off"; fi
knobs_are "knobs-back-after-kill" "$before_kill"

# Who may read: root; a member of the group given with --control-group
# (a drop-in, as an administrator would add it); anyone else is refused
# with how to get access.
groupadd -f wbread
id alice >/dev/null 2>&1 || useradd -M -G wbread alice
id bob >/dev/null 2>&1 || useradd -M bob
mkdir -p /etc/systemd/system/writebehindd.service.d
printf '[Service]\nExecStart=\nExecStart=%s --control-group wbread\n' "$(command -v writebehindd)" \
    >/etc/systemd/system/writebehindd.service.d/group.conf
systemctl daemon-reload
systemctl restart writebehindd
check "wbctl-status-root" wbctl status
check "wbctl-status-group-member" runuser -u alice -- wbctl status
refused_with_how() { ! runuser -u bob -- wbctl status >/dev/null 2>&1 && runuser -u bob -- wbctl status 2>&1 | grep -q -- "--control-group"; }
check "wbctl-status-refused-with-how" refused_with_how
refusal=$(runuser -u bob -- wbctl status 2>&1)
echo "systest:   bob is told: $refusal"

# The fallback backend under the real unit, on every kernel: a kernel that
# refuses fentry gets the tracepoint backend.  vmtest's lifecycle tests
# emulate the unit's confinement; here it is systemd's own.  Debian's
# kernels (perf_event_paranoid 3, their own level) refuse that backend's
# perf events without CAP_SYS_ADMIN, which the unit leaves out: the start
# must fail saying how to add it, and with the drop-in the unit's comment
# gives, the backend must attach, stream and pace.
dropin=/etc/systemd/system/writebehindd.service.d/backend.conf
rm -f /etc/systemd/system/writebehindd.service.d/group.conf
printf '[Service]\nExecStart=\nExecStart=%s --backend tracepoint\n' "$(command -v writebehindd)" >$dropin
systemctl daemon-reload
if (($(cat /proc/sys/kernel/perf_event_paranoid) > 2)); then
    t=$(date +%s)
    systemctl restart writebehindd 2>/dev/null
    check "tracepoint-backend-refusal-says-how" wait_for 20 logged_since "$t" "CapabilityBoundingSet=CAP_SYS_ADMIN"
    systemctl stop writebehindd
    systemctl reset-failed writebehindd
    printf 'CapabilityBoundingSet=CAP_SYS_ADMIN\n' >>$dropin
    systemctl daemon-reload
fi
t=$(date +%s)
systemctl restart writebehindd
check "tracepoint-backend-under-the-unit" [ "$(prop ActiveState)/$(prop SubState)" = active/running ]
check "tracepoint-backend-chosen" logged_since "$t" "backend=tracepoint"
pv -qL 32m $SRC_FILE >/mnt/wb/fallback
sync
check "tracepoint-backend-streams" wait_for 30 logged_since "$t" "stream ended.*ino=$(stat -c %i /mnt/wb/fallback) "
if ((paces)); then
    check "tracepoint-backend-paces" logged_since "$t" "pacing on"
    wait_for 30 logged_since "$t" "pacing off"
fi
rm -f /mnt/wb/fallback
rm -rf /etc/systemd/system/writebehindd.service.d
systemctl daemon-reload
systemctl restart writebehindd

# shellcheck source=db.sh
((DB)) && . $S/db.sh
# shellcheck source=usb.sh
if on_line "$USB_ON"; then
    . $S/usb.sh
else
    skip "usb" "quick: on $USB_ON only (6.12 has this kernel's per-device lever)"
fi
# shellcheck source=nfs.sh
. $S/nfs.sh

echo "systest: journalctl -u writebehindd:"
log | sed 's/^/systest:   /'

score=$(systemd-analyze security writebehindd --no-pager 2>&1 | sed -n 's/.*Overall exposure level for writebehindd.service: //p')
measure exposure "${score:-none}"
# The unit's hardening measured 1.5 (OK) with the .deb's unit; 2.0 leaves
# room for one more need, not for dropping a protection.
check "exposure-at-most-$MAX_EXPOSURE" awk -v s="${score%% *}" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(s != "" && s <= m) }' 

# Purge.
if [ -f $S/writebehindd.deb ]; then
    check "apt-purge" apt-get purge -y -q writebehindd
else
    skip "apt-purge" "--no-deb: disabled, stopped and removed by hand"
    systemctl disable --now writebehindd
    rm -f /usr/local/bin/writebehindd /usr/local/bin/wbctl /etc/systemd/system/writebehindd.service
    systemctl daemon-reload
    rm -rf /run/writebehindd /etc/writebehindd
fi
check "unit-gone" [ "$(systemctl show -p LoadState --value writebehindd)" = not-found ]
check "no-process" [ -z "$(pgrep -x writebehindd)" ]
knobs_are "knobs-as-before-install" "$(cat $STATE/before-install)"
left=$(find /etc /run -path $S -prune -o -name '*writebehind*' -print)
check "nothing-in-etc-or-run" [ -z "$left" ]
[ -n "$left" ] && echo "systest: left: $left"

umount /mnt/wb
losetup -d "$loop"
exit $failed
