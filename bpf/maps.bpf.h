/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The maps BPF keeps and the agent reads or fills: per-file streams, each
 * user's count of them, per-process allowances, the agent's configuration,
 * devices and cgroup policies, the stats and the event ring, with the
 * helpers of the last two.
 */
#ifndef MAPS_BPF_H
#define MAPS_BPF_H

#include "writebehind.h"

/* Per-file state (struct wb_file_stream, in writebehind.h), keyed by the
 * `struct file` address: two processes that open one file get two streams;
 * a reused fd number is a new struct file; a reused struct file address is
 * caught by the inode check. */

/*
 * Per-process state (Linus, 2019: write-behind should be process state, so
 * that tar x and cp -r stream too).  A process's sequential bytes are
 * counted when one of its files crosses a window or is closed, never per
 * write.  Until they exceed the burst allowance its data stays cache-only
 * (Chinner: temp files and zero-then-overwrite must not be written twice);
 * beyond it the process is streaming.  Quiet for quiet_ns, it starts over.
 */
struct proc_stream {
	__u64 streamed;
	__u64 last_ns;
};

/* LRU, not a plain hash: an entry is made at the first write of every
 * eligible file, and some closes are never seen (io_uring closes; on the
 * syscall-tracepoint backend also O_CLOEXEC files closed by execve).  Any
 * user could also fill a plain hash by keeping 65,536 written files open,
 * and every other writer's files would go untracked.  LRU evicts the least
 * recently written instead: a stream that lost its entry starts over at its
 * next write, and the agent lets go of its file when it sees the writer's
 * descriptor gone (no close is reported for an evicted entry). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, WB_STREAMS_MAX);
	__type(key, __u64);
	__type(value, struct wb_file_stream);
} streams SEC(".maps");

/* What each user holds of `streams`.  The LRU is shared: a
 * user holding more written files than it has entries, and writing to each
 * in turn, made a new entry at every write, each evicting the least
 * recently written one.  A writer slower than that churn (256 KiB a second
 * beside four processes cycling through 72,000 files) was evicted between
 * its writes, started over at each and never crossed a window: nothing of
 * it was written back until the kernel's expiry (2 MiB of 2.5 without the
 * churn).  Now a user at WB_USER_SHARE entries gets no new one: its new
 * files are left to the kernel (counted), and what it churns is its own
 * half.  Counted here at insert and delete; an eviction is silent, so a
 * count may be too high until the agent recounts (shares.rs). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, WB_OWNERS_MAX);
	__type(key, __u32);
	__type(value, __s64);
} user_streams SEC(".maps");

/* LRU for the same reason: one entry per process that streamed, and pids
 * are cheap to make.  As large as `streams`: the common LRU keeps up to 128
 * free entries per CPU and evicts before it is full. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, WB_STREAMS_MAX);
	__type(key, __u32);
	__type(value, struct proc_stream);
} procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct wb_config);
} wb_config_map SEC(".maps");

/* Filled by the agent: each device's measured bandwidth (by sb_dev).  Read
 * when a stream starts and at each crossing. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, WB_DEVICES_MAX);
	__type(key, __u32);
	__type(value, struct wb_device);
} devices SEC(".maps");

/* Filled by the agent from the policy files: by cgroup v2 id. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, WB_CGROUPS_MAX);
	__type(key, __u64);
	__type(value, struct wb_policy);
} cgroup_policies SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, WB_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

#define RB_BYTES (1 << 20)

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RB_BYTES);
} events SEC(".maps");

/* Closes of files that never crossed a window (tar x, cp -r tails) yield to
 * streams' windows: they may fill at most half the ring.  Any user can make
 * such closes as fast as it can create files; without this a flood of them
 * would crowd out every other stream's windows.  A shed close leaves that
 * file's tail to the kernel, as without the daemon. */
static __always_inline bool ring_crowded(void)
{
	return bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > RB_BYTES / 2;
}

static __always_inline void stat_inc(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &idx);

	if (v)
		(*v)++;
}

#endif /* MAPS_BPF_H */
