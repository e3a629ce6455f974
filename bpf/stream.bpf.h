/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Stream logic, shared by every hook backend: the hooks only find the
 * `struct file` and the byte range a write touched, then call
 * stream_write() / stream_close().  Everything about windows and events
 * lives here.
 *
 * Hot-path rules (one global lock on a per-write path turned 30 cp's into a
 * spinlock benchmark): a write only does lockless lookups and in-place
 * updates.  Locks are taken only when a file's state is created (a per-bucket
 * hash lock) and when an event is emitted (the ring buffer, once per window).
 */
#ifndef STREAM_BPF_H
#define STREAM_BPF_H

#include "writebehind.h"

/*
 * Kernels before 5.13 (Debian 11's 5.10) refuse a program that merely names
 * a callback (bpf_loop's, 5.17) and have no bpf_get_current_task_btf (5.11);
 * 5.15 (Ubuntu 22.04) has the second but not bpf_loop.  build.rs also
 * compiles this file with -DWB_COMPAT, and the loader takes that object
 * where the kernel has no bpf_loop: the task is read with probe reads and
 * fd tables are walked in bounded loops (5.3+) of at most `max` steps, which
 * the verifier walks one by one: a close walk's step calls stream_close as
 * a global function (5.6+), verified once on its own (inlined, 256 steps
 * were over a million instructions, on 6.18).  Closes at exit and by
 * close_range are seen for the first CLOSE_WALK_COMPAT descriptors, the
 * rest let go by the agent's idle check.  Everything else is the same code.
 */
#ifdef WB_COMPAT
#define current_task()		((struct task_struct *)bpf_get_current_task())
#define TASK_READ(p, f)		BPF_CORE_READ(p, f)
#define fd_loop(n, step, ctx, max)					\
	do {								\
		__u32 __n = (n);					\
		for (__u32 __i = 0; __i < (max) && __i < __n; __i++)	\
			if (step(__i, ctx))				\
				break;					\
	} while (0)
#else
#define current_task()		bpf_get_current_task_btf()
#define TASK_READ(p, f)		((p)->f)
#define fd_loop(n, step, ctx, max)	bpf_loop(n, step, ctx, 0)
#endif
/* Steps of the compat object's loops: a descriptor search, a close walk. */
#define FD_SEARCH_COMPAT	1024
#define CLOSE_WALK_COMPAT	1024

/* From include/linux/fs.h and uapi fcntl.h; not in BTF because they are macros. */
#define FMODE_WRITE	0x2
#define FMODE_RANDOM	0x1000		/* POSIX_FADV_RANDOM */
#define O_APPEND	00002000
#define O_DSYNC		00010000
#define O_DIRECT	00040000
#define __O_SYNC	04000000
#define S_IFMT		00170000
#define S_IFREG		0100000
#define BTRFS_SUPER_MAGIC 0x9123683E
#define BDI_CAP_WRITEBACK 0x1	/* include/linux/backing-dev.h */

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

/*
 * One probe read per kernel object instead of one per field: `blk` holds a
 * copy of the object's first bytes and BLK_FIELD picks a field out of it at
 * its CO-RE offset (a constant once relocated, so the verifier sees a fixed
 * stack offset).  A field beyond the copy falls back to its own read.  This
 * halves the hook's cost per write (measured with the bench's overhead run).
 */
#define BLK_FIELD(blk, ptr, type, field) ({					\
	typeof(((type *)0)->field) __v = 0;					\
	__u32 __off = bpf_core_field_offset(type, field);			\
	if (__off + sizeof(__v) <= sizeof(blk))					\
		__builtin_memcpy(&__v, (char *)(blk) + __off, sizeof(__v));	\
	else									\
		bpf_core_read(&__v, sizeof(__v), &((type *)(ptr))->field);	\
	__v;									\
})

/* The fd table entry for fd in task, or NULL.  The task pointer is trusted,
 * so the walk is plain loads (probe reads in the compat object); the table
 * slot is read as a plain value. */
static __always_inline struct file *task_fd_file(struct task_struct *task, __u32 fd)
{
	struct files_struct *files = TASK_READ(task, files);
	struct fdtable *fdt;
	struct file **fds;
	struct file *file = NULL;

	if (!files)
		return NULL;
	fdt = TASK_READ(files, fdt);
	if (!fdt || fd >= TASK_READ(fdt, max_fds))
		return NULL;
	fds = TASK_READ(fdt, fd);
	bpf_probe_read_kernel(&file, sizeof(file), &fds[fd]);
	return file;
}

static __always_inline struct file *current_fd_file(__u32 fd)
{
	return task_fd_file(current_task(), fd);
}

/* The fentry hooks see a struct file, not a descriptor; the agent reaches a
 * streaming writer's file through its fd (/proc/<pid>/fd/<fd>).  Found by scanning
 * the fd table, once per window, not per write.  Beyond FD_SCAN descriptors
 * (FD_SEARCH_COMPAT in the compat object) the event carries -1 and the agent
 * opens the inode by handle instead. */
#define FD_SCAN 4096

struct fd_search {
	struct file **fds;
	struct file *want;
	__s32 found;
};

static long fd_search_step(__u32 i, void *data)
{
	struct fd_search *s = data;
	struct file *f = NULL;

	bpf_probe_read_kernel(&f, sizeof(f), &s->fds[i]);
	if (f != s->want)
		return 0;
	s->found = i;
	return 1;
}

static __always_inline __s32 current_fd_of(struct file *file)
{
	struct task_struct *task = current_task();
	struct fd_search s = { .want = file, .found = -1 };
	struct files_struct *files = TASK_READ(task, files);
	struct fdtable *fdt;
	__u32 n;

	if (!files)
		return -1;
	fdt = TASK_READ(files, fdt);
	if (!fdt)
		return -1;
	n = TASK_READ(fdt, max_fds);
	s.fds = TASK_READ(fdt, fd);
	fd_loop(n < FD_SCAN ? n : FD_SCAN, fd_search_step, &s, FD_SEARCH_COMPAT);
	return s.found;
}

/* What the stream logic needs to know about a file being written. */
struct file_facts {
	struct inode *inode;
	struct super_block *sb;
	__u64 ino;
	__u64 f_pos;
};

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

/*
 * What write-behind may act on, filling `facts`.  Excluded: by the inode
 * (inode_eligible), anything but a regular file, and files on a bdi without
 * writeback (tmpfs, ramfs: nothing to write back to); by the open file
 * (file_writable), O_DIRECT, O_SYNC/O_DSYNC and POSIX_FADV_RANDOM (those
 * writers manage their own writeback).  A page dirtied through a mapping or
 * io_uring has no file at hand: only its inode is checked.
 */
static __always_inline bool inode_eligible(struct inode *inode, struct file_facts *facts)
{
	struct super_block *sb;
	char iblk[72];
	umode_t imode;

	facts->inode = inode;
	if (bpf_probe_read_kernel(iblk, sizeof(iblk), inode))
		return false;
	imode = BLK_FIELD(iblk, inode, struct inode, i_mode);
	if ((imode & S_IFMT) != S_IFREG)
		return false;
	facts->ino = BLK_FIELD(iblk, inode, struct inode, i_ino);
	sb = BLK_FIELD(iblk, inode, struct inode, i_sb);
	facts->sb = sb;
	return BPF_CORE_READ(sb, s_bdi, capabilities) & BDI_CAP_WRITEBACK;
}

/* The file's own part, from one read: its mode and flags, and f_inode and
 * f_pos into facts. */
static __always_inline bool file_writable(struct file *file, struct file_facts *facts)
{
	char fblk[128];
	unsigned int fmode, flags;

	if (bpf_probe_read_kernel(fblk, sizeof(fblk), file))
		return false;
	fmode = BLK_FIELD(fblk, file, struct file, f_mode);
	flags = BLK_FIELD(fblk, file, struct file, f_flags);
	if (!(fmode & FMODE_WRITE) || (fmode & FMODE_RANDOM))
		return false;
	if (flags & (O_DIRECT | O_DSYNC | __O_SYNC))
		return false;
	facts->f_pos = BLK_FIELD(fblk, file, struct file, f_pos);
	facts->inode = BLK_FIELD(fblk, file, struct file, f_inode);
	return true;
}

/* A local copy of the pointer: a CO-RE chain must start at a kernel type,
 * not at a member of our own struct (that relocation fails to load). */
static __always_inline __s64 inode_size(struct inode *inode)
{
	return BPF_CORE_READ(inode, i_size);
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

/* The btrfs_inode around inode, or NULL on other filesystems (or kernels
 * without btrfs): btrfs keeps per-subvolume facts there. */
static __always_inline struct btrfs_inode *btrfs_inode_of(struct inode *inode, __u32 magic)
{
	if (!bpf_core_type_exists(struct btrfs_inode) || magic != BTRFS_SUPER_MAGIC)
		return NULL;
	return (void *)inode - bpf_core_field_offset(struct btrfs_inode, vfs_inode);
}

/* User namespaces nest at most this deep (include/linux/user_namespace.h). */
#define USERNS_MAX_LEVEL 32

/*
 * Whose share a new entry of the current task counts in, in BPF's stream
 * map and in the agent's streams, queues and flush memory alike: its real uid in
 * the initial user namespace.  Inside a user namespace, whoever made the
 * outermost one below the initial: a user's subordinate uids (/etc/subuid,
 * LDAP or sssd ranges alike) are usable only inside namespaces that user
 * made, so a rootless container's many uids share their owner's half.  A
 * namespace root made (a system container, docker's userns-remap,
 * PrivateUsers=) is an owner of its own, by its inode number (0xF0000000
 * and above, beyond the uids in use): keyed on root, every such container
 * would share one half with root and the system's services, and one of
 * them could take it from all the others.
 */
static __always_inline __u32 current_owner(void)
{
	struct task_struct *task = current_task();
	/* The objective credentials: overlayfs (a container's rootfs) writes
	 * its upper files under the mounter's, overridden in task->cred, and
	 * every container's writes would count as root's. */
	const struct cred *cred = BPF_CORE_READ(task, real_cred);
	struct user_namespace *ns = BPF_CORE_READ(cred, user_ns);
	__u32 owner;

	for (int i = 0; i < USERNS_MAX_LEVEL; i++) {
		int level = BPF_CORE_READ(ns, level);

		if (level <= 0)
			break;
		if (level == 1) {
			owner = BPF_CORE_READ(ns, owner.val);
			return owner ? owner : BPF_CORE_READ(ns, ns.inum);
		}
		ns = BPF_CORE_READ(ns, parent);
	}
	return BPF_CORE_READ(cred, uid.val);
}

/* Everything an event says of the writer, the file and its device. */
static __always_inline void fill_event(struct wb_event *e, __u32 kind, struct inode *inode, __s32 fd,
				       __u64 ino, __u64 start, __u64 end)
{
	struct backing_dev_info *bdi;
	struct btrfs_inode *bi;

	e->kind = kind;
	e->tgid = bpf_get_current_pid_tgid() >> 32;
	e->fd = fd;
	e->generation = BPF_CORE_READ(inode, i_generation);
	e->fs_magic = BPF_CORE_READ(inode, i_sb, s_magic);
	e->sb_dev = BPF_CORE_READ(inode, i_sb, s_dev);
	e->owner = current_owner();
	/* stat(2) on btrfs reports the subvolume's anonymous dev, not s_dev;
	 * its handles also name the subvolume root. */
	bi = btrfs_inode_of(inode, e->fs_magic);
	e->st_dev = bi ? BPF_CORE_READ(bi, root, anon_dev) : e->sb_dev;
	e->fs_root = bi ? BPF_CORE_READ(bi, root, root_key.objectid) : 0;
	e->ino = ino;
	e->start = start;
	e->end = end;
	e->ts_ns = bpf_ktime_get_ns();
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	bdi = BPF_CORE_READ(inode, i_sb, s_bdi);
	bpf_probe_read_kernel_str(e->bdi, sizeof(e->bdi), bdi->dev_name);
	e->bdi_bw_pages = BPF_CORE_READ(bdi, wb.avg_write_bandwidth);
	e->bdi_dirty_pages = BPF_CORE_READ(bdi, wb.stat[0].count) +	/* WB_RECLAIMABLE */
			     BPF_CORE_READ(bdi, wb.stat[1].count);	/* WB_WRITEBACK */
}

/* Set while batched records may wait in the ring unread (see wakeup()). */
static volatile bool batched_waiting;

/* How an event wakes the agent.  Closes of files that never crossed a
 * window (tar x: one per file, left to the kernel's flusher on a paced
 * device) wait in the ring for the agent's next pass, at most BATCH_AGE
 * (100 ms) away: a wakeup each cost the agent an epoll round per close
 * (tar x of 30,000 files: agent CPU 0.29 s with a wakeup per close, 0.02 s
 * batched).  Once the ring holds an eighth of its size they wake it.  Any
 * other event wakes it adaptively, as before (forcing them all halved the
 * agent's rate in a flood of unpaced closes), but forced when batched
 * records may be waiting: the adaptive wakeup fires only for a record at
 * the consumer's position, and a span or a held file's close must not wait
 * behind them. */
static __always_inline __u64 wakeup(bool batched)
{
	if (!batched) {
		if (!batched_waiting)
			return 0;
		batched_waiting = false;
		return BPF_RB_FORCE_WAKEUP;
	}
	if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) < RB_BYTES / 8) {
		batched_waiting = true;
		return BPF_RB_NO_WAKEUP;
	}
	return BPF_RB_FORCE_WAKEUP;
}

/* An event about inode; fd -1 when the writer's descriptor is not known
 * (the agent then reaches the inode by handle). */
static __always_inline void emit_inode(__u32 kind, struct inode *inode, __s32 fd,
				       __u64 ino, __u64 start, __u64 end, bool batched)
{
	struct wb_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		stat_inc(WB_STAT_RB_DROPS);
		return;
	}
	fill_event(e, kind, inode, fd, ino, start, end);
	bpf_ringbuf_submit(e, wakeup(batched));
}

/* An event about file: a span names the writer's descriptor, looked up if
 * the hook did not see one. */
static __always_inline void emit(__u32 kind, struct file *file, __s32 fd,
				 __u64 ino, __u64 start, __u64 end, bool batched)
{
	if (fd < 0 && kind == WB_EV_SPAN)
		fd = current_fd_of(file);
	emit_inode(kind, BPF_CORE_READ(file, f_inode), fd, ino, start, end, batched);
}

/* The names from file's dentry up to the root of the mount it was opened
 * through (struct wb_path_event).  False when the path is deeper than
 * WB_PATH_DEPTH, a name longer than NAME_MAX or unreadable: names ending
 * early would lead the agent elsewhere.  A bounded loop: 16 steps of a few
 * reads, on kernels from 5.3. */
static __always_inline bool fill_path(char names[WB_PATH_DEPTH][WB_NAME_LEN], struct file *file)
{
	struct dentry *d = BPF_CORE_READ(file, f_path.dentry);
	struct dentry *root = BPF_CORE_READ(file, f_path.mnt, mnt_root);
	struct dentry *parent;
	__u32 i;

	for (i = 0; i < WB_PATH_DEPTH; i++) {
		parent = BPF_CORE_READ(d, d_parent);
		if (!parent)
			return false;
		/* The filesystem's root is its own parent. */
		if (d == root || parent == d) {
			names[i][0] = 0;
			return i > 0;
		}
		if (BPF_CORE_READ(d, d_name.len) >= WB_NAME_LEN)
			return false;
		if (bpf_probe_read_kernel_str(names[i], WB_NAME_LEN, BPF_CORE_READ(d, d_name.name)) <= 1)
			return false;
		d = parent;
	}
	return d == root || BPF_CORE_READ(d, d_parent) == d;
}

/* A close.  On a filesystem without export operations (exFAT) the agent
 * cannot open the file by handle: the event carries its path instead
 * (WB_EV_CLOSE_PATH).  Checked here, only for closes that are reported.
 * batched: a file that never crossed a window (see wakeup()). */
static __always_inline void emit_close(struct file *file, __s32 fd, __u64 ino, __u64 start, __u64 end,
				       bool batched)
{
	struct super_block *sb = BPF_CORE_READ(file, f_inode, i_sb);
	struct wb_path_event *pe;

	/* Paths only for filesystems on a block device (major != 0): a network
	 * filesystem without export operations (CIFS, 9p) would turn each
	 * close into lookups and an open on its server, from the device's
	 * flusher thread. */
	__u32 sb_dev = BPF_CORE_READ(sb, s_dev);

	/* A device the agent has still to pace: the first close starts it. */
	if (batched) {
		struct wb_device *d = bpf_map_lookup_elem(&devices, &sb_dev);

		batched = d && d->batch_closes;
	}
	if (BPF_CORE_READ(sb, s_export_op) || !(sb_dev >> WB_MINORBITS)) {
		emit(WB_EV_CLOSE, file, fd, ino, start, end, batched);
		return;
	}
	pe = bpf_ringbuf_reserve(&events, sizeof(*pe), 0);
	if (!pe) {
		/* No room for the path: the plain close still lets the agent
		 * go of a file it holds. */
		emit(WB_EV_CLOSE, file, fd, ino, start, end, batched);
		return;
	}
	if (!fill_path(pe->names, file)) {
		/* Sent without its path: the agent counts it unreachable
		 * (and lets go of the file if it held it). */
		bpf_ringbuf_discard(pe, 0);
		emit(WB_EV_CLOSE, file, fd, ino, start, end, batched);
		return;
	}
	fill_event(&pe->ev, WB_EV_CLOSE_PATH, BPF_CORE_READ(file, f_inode), fd, ino, start, end);
	bpf_ringbuf_submit(pe, wakeup(batched));
}

/* The count of entries owner holds, made if missing.  NULL when
 * user_streams is full (WB_OWNERS_MAX owners with files): such an owner's
 * entries go uncounted rather than untracked. */
static __always_inline __s64 *user_count(__u32 owner)
{
	__s64 zero = 0, *n = bpf_map_lookup_elem(&user_streams, &owner);

	if (n)
		return n;
	bpf_map_update_elem(&user_streams, &owner, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&user_streams, &owner);
}

/* An entry of owner's is gone (deleted, or replaced by another's). */
static __always_inline void user_release(__u32 owner)
{
	__s64 *n = bpf_map_lookup_elem(&user_streams, &owner);

	if (n && *n > 0)
		__sync_fetch_and_add(n, -1);
}

/* The entry's clock (wb_file_stream.touched): 2^WB_TOUCH_SHIFT ns. */
static __always_inline __u32 touch_now(void)
{
	return bpf_ktime_get_ns() >> WB_TOUCH_SHIFT;
}

/* A page dirtied this far past a mapped stream's end still continues it:
 * the dirtied folio may be large, and only its first page is counted. */
#define DIRTY_GAP (2ULL << 20)

/*
 * The stream logic of one write to [start, end) of an eligible file, by key:
 * sequential writes extend the stream; anything else restarts it at this
 * write, so random writers never accumulate a window and never cause a
 * flush.  Each window of sequential data is counted for the process; once
 * the process streams, everything unflushed before the write position goes
 * to the agent.  `file` is NULL for pages dirtied through a mapping or
 * io_uring (stream_dirtied): the agent reaches those by handle.
 */
static __always_inline void stream_advance(__u64 key, struct wb_file_stream *s, struct file_facts *facts,
					   __u64 start, __u64 end, struct file *file, __s32 fd)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct wb_config *cfg = wb_cfg();
	struct wb_policy *pol;

	if (!cfg)
		return;
	/* A mapped stream is the inode's: another process dirtying it starts over. */
	if (!s || s->ino != facts->ino || (!file && s->tgid != tgid)) {
		/* Not BPF_CORE_READ(facts->sb, ...): the access chain would then
		 * start at our own struct, which the kernel's BTF does not know. */
		struct super_block *sb = facts->sb;
		struct wb_file_stream fresh = {
			.ino = facts->ino,
			.inode = (__u64)facts->inode,
			.head = start,
			.mark = start,
			.pos = end,
			.tgid = tgid,
			.sb_dev = BPF_CORE_READ(sb, s_dev),
		};

		/* A stream of a writer whose policy is off is kept too, with
		 * mode off: its next writes stop at the lookup above. */
		__u32 replaced = s ? s->owner : 0;
		__s64 *n;

		fresh.owner = current_owner();
		fresh.touched = touch_now();
		/* A new entry, or one taken over from another user, must fit
		 * the writer's share; otherwise the file is left to the kernel
		 * (and an entry it would have replaced is let go). */
		if (!s || replaced != fresh.owner) {
			n = user_count(fresh.owner);
			if (n && *n >= WB_USER_SHARE) {
				stat_inc(WB_STAT_USER_SHARE);
				if (s && !bpf_map_delete_elem(&streams, &key))
					user_release(replaced);
				return;
			}
		} else {
			n = NULL;	/* the owner's own entry, replaced */
		}
		pol = current_policy(cfg);
		fresh.mode = policy_mode(pol, cfg);
		fresh.window = policy_window(pol, cfg, fresh.sb_dev);
		if (bpf_map_update_elem(&streams, &key, &fresh, BPF_ANY)) {
			stat_inc(WB_STAT_MAP_FULL);
			return;
		}
		if (n)
			__sync_fetch_and_add(n, 1);
		if (s && replaced != fresh.owner)
			user_release(replaced);
		return;
	}
	/* The file's latest writer owns its close (stream_close): a process
	 * sharing the file that writes to it (a shell's `{ echo; dd; } > out`)
	 * takes it over from the one that wrote first. */
	if (file)
		s->tgid = tgid;
	if (s->mode == WB_MODE_OFF)
		return;
	/* A page just before a mapped stream's end dirtied again (stored to
	 * after its writeback) neither extends nor restarts it. */
	if (!file && start < s->pos && start + DIRTY_GAP >= s->pos)
		return;
	/* Not contiguous (for a mapped stream: further back, a rewrite from
	 * the start or a header, or more than DIRTY_GAP ahead): the stream
	 * restarts here, and what was written before it is left to the kernel. */
	if (file ? start != s->pos || (s->mode == WB_MODE_APPEND && end != inode_size(facts->inode))
		 : start < s->pos || start - s->pos > DIRTY_GAP) {
		s->head = s->mark = start;
		s->pos = end;
		return;
	}
	s->pos = end;
	if (end - s->mark < s->window)
		return;
	/* Only here, not at every write (a clock read per write showed in the
	 * bench's per-call cost): an entry that crosses no window for a
	 * minute looks idle, which matters only for a user at its share. */
	s->touched = touch_now();
	pol = current_policy(cfg);
	s->mode = policy_mode(pol, cfg);	/* on battery, or reloaded */
	s->window = policy_window(pol, cfg, s->sb_dev);
	if (s->mode == WB_MODE_OFF || !proc_streaming(pol, end - s->mark)) {
		s->mark = end;
		return;
	}
	s->mark = end;
	/* On a device with a grain, up to its last multiple: the rest goes
	 * with a later span, or the close's. */
	struct wb_device *d = bpf_map_lookup_elem(&devices, &s->sb_dev);
	if (d && d->grain) {
		end &= ~(d->grain - 1);
		if (end <= s->head)
			return;
	}
	if (file)
		emit(WB_EV_SPAN, file, fd, facts->ino, s->head, end, false);
	else
		emit_inode(WB_EV_SPAN, facts->inode, -1, facts->ino, s->head, end, false);
	s->head = end;
	s->spans++;
}

/* A write of `len` bytes to file (through fd) completed, at `pos`, or for
 * writes at the file position (pos < 0) ending at f_pos. */
static __always_inline void stream_write(struct file *file, __s32 fd, __s64 pos, __u64 len)
{
	__u64 key = (__u64)file, end;
	struct file_facts facts = {};
	struct wb_file_stream *s;

	if (!file || !len || !file_writable(file, &facts))
		return;
	s = bpf_map_lookup_elem(&streams, &key);
	/* A file with a stream had its inode checked when the stream started:
	 * checked again only for another inode (the struct file's address
	 * reused).  Three reads fewer per write (bench: hook ns per run).  A
	 * stale entry (its close unseen) whose struct file and inode addresses
	 * were both reused keeps its old ino: the agent's identity check
	 * refuses its spans, and the LRU ages it out. */
	if (s && s->inode == (__u64)facts.inode)
		facts.ino = s->ino;
	else if (!inode_eligible(facts.inode, &facts))
		return;
	end = pos < 0 ? facts.f_pos : pos + len;
	stream_advance(key, s, &facts, end - len, end, file, fd);
}

/* A page of the inode behind mapping, at byte `start`, became dirty in the
 * current process, and no write hook saw it: a store through a shared
 * mapping, or an io_uring or AIO write.  Its stream is keyed by the mapping
 * (never a struct file's address) and ends with no close: the agent lets
 * go of it when the writer has exited.
 *
 * A filesystem's own metadata is dirtied in the writer too, outside its
 * write syscalls (btrfs's btree inode, when cp -r creates and closes files),
 * and such an inode is never given a mode: its i_mode is whatever the slab
 * object held before, often a regular file's.  Measured: one cp -r of 859
 * MiB to a fresh btrfs in five made a stream of the btree inode (ino 1, root
 * 1, generation 0), which no handle reaches.  Only an inode some process
 * could have opened for writing has a write_iter (the VFS gives the others
 * no_open_fops), and every page dirtied through a mapping or io_uring came
 * from such a file. */
static __always_inline void stream_dirtied(struct address_space *mapping, __u64 start)
{
	__u64 key = (__u64)mapping;
	struct file_facts facts = {};
	struct wb_file_stream *s;
	struct inode *host = BPF_CORE_READ(mapping, host);

	if (!BPF_CORE_READ(host, i_fop, write_iter) || !inode_eligible(host, &facts))
		return;
	s = bpf_map_lookup_elem(&streams, &key);
	stream_advance(key, s, &facts, start, start + 4096, NULL, -1);
}

/* fd is going away in the current process: a streaming process's tail goes
 * to writeback; a process within its burst leaves it to the kernel.  A file
 * that had spans is always reported, even with nothing left to flush: the
 * agent holds it and must let go (a held file makes umount fail). */
static __always_inline void stream_close(struct file *file, __s32 fd)
{
	__u64 key = (__u64)file;
	struct wb_file_stream *s;
	__u32 owner;
	struct wb_config *cfg;
	struct wb_policy *pol;
	bool tail = false;

	if (!file)
		return;
	s = bpf_map_lookup_elem(&streams, &key);
	if (!s)
		return;
	/* Another process's copy of the stream's file: a child forked while
	 * it was open, which never wrote to it, closes it at execve, with
	 * close_range (python's subprocess) or at exit.  The writer still
	 * holds it; acting on the child's close lost the writer's close, and
	 * with it the file's tail (seen on the tracepoint backend: one close
	 * event instead of two).  The latest writer owns the record
	 * (stream_advance). */
	if (s->tgid != (__u32)(bpf_get_current_pid_tgid() >> 32))
		return;
	cfg = wb_cfg();
	if (cfg && s->mode != WB_MODE_OFF && s->pos > s->head) {
		/* A file that never crossed a window is flushed at close only
		 * for multi-file writers (tar x, cp -r). */
		pol = current_policy(cfg);
		tail = proc_streaming(pol, s->pos - s->mark) && (s->spans || pol->multi_file);
	}
	if ((tail || s->spans) && s->ino == BPF_CORE_READ(file, f_inode, i_ino)) {
		if (!s->spans && ring_crowded())
			stat_inc(WB_STAT_CLOSES_SHED);
		else
			emit_close(file, fd, s->ino, s->head, tail ? s->pos : s->head, !s->spans);
	}
	owner = s->owner;
	if (!bpf_map_delete_elem(&streams, &key))
		user_release(owner);
}

/*
 * The current process asked for writeback of file itself (fsync, fdatasync,
 * sync_file_range): it manages that file's writeback (a database and its
 * WAL, a package manager, Linus's loop).  Write-behind's windows on it would
 * only add writeback it did not ask for, and count the writer as streaming,
 * which paces its device.  pgbench beside a copy (ext4, 100 MiB/s): its
 * transactions' p99 392 -> 208 ms, what its cgroup at mode "off" gets
 * (202), and the device held 72.6 -> 11.6 MiB (the database had counted as
 * a second streaming writer: stream_dirty twice over).
 * Its stream turns off until the file is closed (or its entry is evicted);
 * a file the agent holds is still let go of at close.  Only a stream the
 * writer's policy leaves to it; a file with no stream yet (nothing written
 * through this open file since the daemon started) gets one at its next
 * write and is turned off at its next sync.
 */
static __always_inline void stream_synced(struct file *file)
{
	__u64 key = (__u64)file;
	struct wb_file_stream *s;
	struct wb_config *cfg;

	if (!file)
		return;
	s = bpf_map_lookup_elem(&streams, &key);
	if (!s || s->mode == WB_MODE_OFF || s->inode != (__u64)BPF_CORE_READ(file, f_inode))
		return;
	/* Only the writer's own sync says it manages its writeback: another
	 * process sharing the open file (a parent after its child's copy, one
	 * that received the fd) leaves the writer's stream alone, and the
	 * policy read below is then the writer's. */
	if (s->tgid != (__u32)(bpf_get_current_pid_tgid() >> 32))
		return;
	cfg = wb_cfg();
	if (!cfg || !current_policy(cfg)->leave_synced)
		return;
	s->mode = WB_MODE_OFF;
	stat_inc(WB_STAT_SELF_SYNCED);
}

/* The process is gone: forget its allowance. */
static __always_inline void proc_exit(__u32 tgid)
{
	bpf_map_delete_elem(&procs, &tgid);
}

#endif /* STREAM_BPF_H */
