/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What the writer's policy says: looked up by its cgroup (the agent's
 * cgroup_policies, else wb_config.dflt), the window it gives a stream on a
 * device, and the burst allowance of the writer's process.
 */
#ifndef POLICY_BPF_H
#define POLICY_BPF_H

#include "maps.bpf.h"

static __always_inline struct wb_config *wb_cfg(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&wb_config_map, &zero);
}

/* The policy of the current task's cgroup.  Looked up when a stream starts,
 * at window crossings and at closes, never per write. */
static __always_inline struct wb_policy *current_policy(struct wb_config *cfg)
{
	__u64 cg = bpf_get_current_cgroup_id();
	struct wb_policy *p = bpf_map_lookup_elem(&cgroup_policies, &cg);

	return p ? p : &cfg->dflt;
}

static __always_inline __u8 policy_mode(struct wb_policy *p, struct wb_config *cfg)
{
	return cfg->on_battery && p->on_battery == WB_BATTERY_OFF ? WB_MODE_OFF : p->mode;
}

/* Counts `bytes` of sequential data for the current process; true once it
 * has streamed past its burst allowance. */
static __always_inline bool proc_streaming(struct wb_policy *pol, __u64 bytes)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__u64 now = bpf_ktime_get_ns();
	struct proc_stream *p = bpf_map_lookup_elem(&procs, &tgid);

	if (!p) {
		struct proc_stream fresh = { .streamed = bytes, .last_ns = now };

		bpf_map_update_elem(&procs, &tgid, &fresh, BPF_ANY);
		return bytes > pol->burst;
	}
	if (now - p->last_ns > pol->quiet_ns)
		p->streamed = 0;
	p->streamed += bytes;
	p->last_ns = now;
	return p->streamed > pol->burst;
}

/* The window policy p gives a stream on the device behind sb_dev: fixed, or
 * window_ms of the device's measured bandwidth within [min, max]_window and
 * never below one maximal request; min_window for a device not measured. */
static __always_inline __u64 policy_window(struct wb_policy *p, struct wb_config *cfg, __u32 sb_dev)
{
	__u64 w = p->window;

	if (!w) {
		struct wb_device *d = bpf_map_lookup_elem(&devices, &sb_dev);

		w = d ? d->bw * p->window_ms / 1000 : 0;
		if (w < p->min_window)
			w = p->min_window;
		if (w > p->max_window)
			w = p->max_window;
		if (d && w < d->floor)
			w = d->floor;
	}
	if (cfg->on_battery && p->on_battery == WB_BATTERY_LAZY)
		w *= WB_BATTERY_LAZY_FACTOR;
	return w ? w : 4096;
}

#endif /* POLICY_BPF_H */
