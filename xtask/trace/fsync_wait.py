#!/usr/bin/env python3
"""What a waiting fdatasync waits for, from `perf script` output.

Record, while `cargo xtask bench --quick --only copy --fs ext4` runs:

    perf record -a -o fsync.data -e syscalls:sys_enter_fdatasync \
        -e syscalls:sys_exit_fdatasync -e 'jbd2:*commit*' \
        -e block:block_bio_queue -e block:block_rq_issue -e block:block_rq_complete
    perf script -i fsync.data | xtask/trace/fsync_wait.py UPPER_DEV [PROBE_COMM]

UPPER_DEV is the bench filesystem's loop device ("7,1"), whose requests
wait in the blkio throttle of the loop device below it.  For each
fdatasync of the probe (comm PROBE_COMM, default any) while data is
written back (the longest run of the flushers' writes, the daemon's or the
kernel's, without a pause of a second: the copy and its sync) the
script prints its time, the journal commit that carried it (waiting for
running handles, submitting ordered data, then logging: the journal's
writes and waiting for ordered data), and what was in flight on the device
when it started: bytes issued and not completed, by who submitted them
(the daemon's flush-* threads, the kernel's flusher kworkers, jbd2,
anyone else).  Then the same as totals over the slow ones (> 100 ms).
"""
import re
import sys
from collections import defaultdict

EV = re.compile(r"^\s*(?P<comm>.+?)\s+(?P<pid>\d+)\s+\[\d+\]\s+(?P<t>[\d.]+):\s+(?P<ev>[\w:]+):\s*(?P<rest>.*)$")
BLK = re.compile(r"^(?P<dev>\d+,\d+) (?P<rwbs>\S+) .*?(?P<sector>\d+) \+ (?P<n>\d+)")


def who(comm):
    if comm.startswith("flush-"):
        return "daemon"
    if "+fl" in comm or "flush" in comm:
        return "kernel flusher"
    if comm.startswith("jbd2"):
        return "jbd2"
    if comm.startswith("kworker"):
        return "kernel flusher"  # the bdi's writeback work (its comm has no "+flush")
    return "other:" + comm.split("/")[0]


def main():
    dev = sys.argv[1]
    probe = sys.argv[2] if len(sys.argv) > 2 else None
    submitter = {}  # sector -> who queued the bio there
    inflight = {}  # sector -> (bytes, who, issued at)
    pending = {}  # pid -> (start, inflight snapshot)
    commit = {}  # phase -> time, of the running commit
    commits = []  # (start, locking, flushing, logging, end)
    syncs = []
    writes = []  # when data was queued: the copy is the longest busy run
    for line in sys.stdin:
        m = EV.match(line)
        if not m:
            continue
        comm, pid, t, ev, rest = m["comm"].strip(), int(m["pid"]), float(m["t"]), m["ev"], m["rest"]
        if ev.startswith("block:"):
            b = BLK.match(rest)
            if not b or b["dev"] != dev or "W" not in b["rwbs"] and "F" not in b["rwbs"]:
                continue
            sector, n = int(b["sector"]), int(b["n"])
            # The event's own comm (perf's column is stale for tasks made
            # after it started: kthreadd for a new jbd2 or kworker).
            tail = re.search(r"\[([^\]]*)\]\s*$", rest)
            comm = tail[1] if tail else comm
            if ev == "block:block_bio_queue":
                submitter[sector] = who(comm)
                if submitter[sector] in ("daemon", "kernel flusher"):
                    writes.append(t)
            elif ev == "block:block_rq_issue":
                inflight[sector] = (n * 512, submitter.pop(sector, who(comm)), t)
            elif ev == "block:block_rq_complete":
                inflight.pop(sector, None)
        elif ev.startswith("jbd2:"):
            phase = ev.split("_", 1)[1]
            if phase == "start_commit":
                commit = {"start": t}
            else:
                commit[phase] = t
            if phase == "end_commit":
                commits.append(commit)
        elif ev == "syscalls:sys_enter_fdatasync" and (probe is None or comm.startswith(probe)):
            ahead = defaultdict(int)
            for size, w, _ in inflight.values():
                ahead[w] += size
            pending[pid] = (t, dict(ahead))
        elif ev == "syscalls:sys_exit_fdatasync" and pid in pending:
            start, ahead = pending.pop(pid)
            syncs.append((start, t, ahead))
    first, last = longest_run(writes)
    report([x for x in syncs if first <= x[0] <= last], commits)


def longest_run(times, gap=1.0):
    """The longest stretch of times with no gap over `gap` seconds."""
    best, start = (0.0, 0.0), None
    for prev, t in zip([None] + times, times):
        if prev is None or t - prev > gap:
            start = t
        if t - start > best[1] - best[0]:
            best = (start, t)
    return best


def report(syncs, commits):
    slow_total = defaultdict(float)
    phases = defaultdict(float)
    slow = 0
    for start, end, ahead in syncs:
        ms = (end - start) * 1000
        c = next((c for c in commits if c.get("start", 0) >= start - 0.001 and c.get("end_commit", 1e18) <= end + 0.001), None)
        split = ""
        if c and {"commit_locking", "commit_flushing", "commit_logging"} <= c.keys():
            parts = (
                ("wait_before", c["start"] - start),
                ("handles", c["commit_flushing"] - c["start"]),
                ("ordered_submit", c["commit_logging"] - c["commit_flushing"]),
                ("log_and_ordered_wait", c["end_commit"] - c["commit_logging"]),
            )
            split = " ".join(f"{k}={v * 1000:.0f}" for k, v in parts)
            if ms > 100:
                for k, v in parts:
                    phases[k] += v * 1000
        mib = " ".join(f"{k}={v / 2**20:.1f}" for k, v in sorted(ahead.items()))
        print(f"{start:.3f} {ms:7.1f} ms  commit[{split}]  in flight MiB: {mib}")
        if ms > 100:
            slow += 1
            for k, v in ahead.items():
                slow_total[k] += v
    n = len(syncs)
    if n:
        lat = sorted((e - s) * 1000 for s, e, _ in syncs)
        print(f"\n{n} fdatasyncs: p50 {lat[n // 2]:.0f} ms, p99 {lat[min(n - 1, n * 99 // 100)]:.0f} ms, max {lat[-1]:.0f}")
    if slow:
        print(f"{slow} over 100 ms; mean ms by phase: " + " ".join(f"{k}={v / slow:.0f}" for k, v in phases.items()))
        print("mean MiB in flight at their start: " + " ".join(f"{k}={v / slow / 2**20:.1f}" for k, v in slow_total.items()))


if __name__ == "__main__":
    main()
