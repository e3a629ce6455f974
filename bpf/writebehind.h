/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * The ABI between the BPF programs and the Rust agent: every struct and
 * constant that crosses the boundary is defined here, once.  The agent gets
 * its Rust copy from bindgen at build time (agent/build.rs), never by hand.
 */
#ifndef WRITEBEHIND_H
#define WRITEBEHIND_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

/* What an event tells the agent. */
enum wb_event_kind {
	/* The unflushed sequential span of a file reached the window. */
	WB_EV_SPAN = 1,
	/* A streaming process closed a file with unflushed data (close, dup2
	 * over it, exit).  The fd is gone: the agent reaches the inode through
	 * a file handle built from ino, generation and (btrfs) root. */
	WB_EV_CLOSE = 2,
	/* WB_EV_CLOSE of a file on a filesystem without file handles (no
	 * export operations: exFAT): a struct wb_path_event, whose names let
	 * the agent look the file up beneath its mount instead. */
	WB_EV_CLOSE_PATH = 3,
};

/*
 * One ring-buffer record.  [start, end) is the byte range the agent should
 * hand to writeback; for WB_EV_CLOSE it is the unflushed tail (may be empty).
 * st_dev uses the kernel's internal dev_t encoding (major << WB_MINORBITS |
 * minor).
 */
#define WB_MINORBITS 20	/* the kernel's MINORBITS (include/linux/kdev_t.h) */

struct wb_event {
	__u32 kind;      /* enum wb_event_kind */
	__u32 tgid;      /* process that wrote */
	__s32 fd;        /* its descriptor at the time of the event */
	__u32 st_dev;    /* the device stat(2) reports for the file */
	__u64 ino;       /* inode number: with st_dev, checked before acting */
	__u32 generation; /* i_generation: a handle to a reused inode goes stale */
	__u32 fs_magic;  /* s_magic, to know how its file handles are laid out */
	__u64 fs_root;   /* btrfs: the subvolume's root objectid; else 0 */
	__u32 sb_dev;    /* the superblock's s_dev, as /proc/self/mountinfo lists it
	                  * (differs from st_dev on btrfs subvolumes); keys `devices` */
	__u32 owner;     /* whose share the writer's files count in (current_owner
	                  * in owner.bpf.h): one owner gets at most half of
	                  * the agent's streams, queues and flush memory */
	__u64 bdi_bw_pages; /* the kernel's avg_write_bandwidth of the bdi's root
	                     * writeback, in pages per second (starts at 100 MB/s
	                     * before the device was ever measured) */
	__u64 bdi_dirty_pages; /* dirty + under-writeback pages of the bdi's root
	                        * writeback (the percpu counters' approximate sum) */
	__u64 start;
	__u64 end;
	__u64 ts_ns;     /* bpf_ktime_get_ns() when emitted */
	char comm[16];
	char bdi[32];    /* backing device name, as in /sys/class/bdi ("7:0") */
	__u8 mode;       /* the stream's enum wb_mode: WB_MODE_OBSERVE, the agent
	                  * only counts what it would have done */
	__u8 _pad[7];
};

/* A closed file's path beneath its mount: at most WB_PATH_DEPTH names of
 * at most NAME_MAX bytes.  A deeper path, or a longer name (exFAT allows
 * 255 UTF-16 units, up to 765 bytes of UTF-8), is sent as a plain
 * WB_EV_CLOSE, which the agent counts as unreachable.  16 names of 255
 * bytes with their slashes fit PATH_MAX. */
#define WB_PATH_DEPTH 16
#define WB_NAME_LEN 256

/*
 * The record of a WB_EV_CLOSE_PATH (4232 bytes; only on filesystems
 * without file handles).  names[0] is the file's name, names[i] its i-th
 * ancestor's, up to and excluding the root of the mount it was written
 * through; each NUL-terminated, the list ended by an empty name unless all
 * WB_PATH_DEPTH are used.  Names after the end are garbage.  Read at
 * close, so a rename races it: the agent checks st_dev and ino after the
 * lookup.
 */
struct wb_path_event {
	struct wb_event ev;
	char names[WB_PATH_DEPTH][WB_NAME_LEN];
};

/* wb_event.fs_magic of a block device written through its node (dd
 * of=/dev/sdb): its pages are the device's own page cache, on its disk's
 * bdi.  Then st_dev and sb_dev are the device's own number (a partition's
 * too), bdi its disk's, and ino and generation the node's, which the agent
 * never opens: the device is paced, its writer's file is not reached
 * (BDEVFS_MAGIC, the kernel's block-device pseudo-filesystem). */
#define WB_BLOCK_DEVICE_MAGIC 0x62646576

/* Policy modes (the 2019 patch's vm.dirty_write_behind values). */
enum wb_mode {
	WB_MODE_OFF = 0,        /* leave this writer to the kernel */
	WB_MODE_APPEND = 1,     /* only writes that end at EOF stream */
	WB_MODE_SEQUENTIAL = 2, /* any sequential run streams */
	WB_MODE_OBSERVE = 3,    /* detected as WB_MODE_SEQUENTIAL; the agent
	                         * reports what it would do and acts on nothing */
};

/* What on_battery does to a policy while the host runs on battery. */
enum wb_battery {
	WB_BATTERY_SAME = 0,
	WB_BATTERY_LAZY = 1,    /* windows WB_BATTERY_LAZY_FACTOR times longer */
	WB_BATTERY_OFF = 2,     /* mode off */
};

/* How much longer WB_BATTERY_LAZY makes windows (and the agent its dirty
 * limits) while the host runs on battery. */
#define WB_BATTERY_LAZY_FACTOR 4

/*
 * What BPF applies to a writer, by its cgroup: the `cgroup_policies` hash map
 * (key: the cgroup v2 id, __u64, as bpf_get_current_cgroup_id() returns it)
 * holds one per cgroup a policy names; any other cgroup gets wb_config.dflt.
 * Filled by the agent from the policy files, for at most WB_CGROUPS_MAX
 * cgroups.
 */
#define WB_CGROUPS_MAX 16384

struct wb_policy {
	__u64 window;      /* fixed window in bytes; 0: window_ms of the device's
	                    * bandwidth (wb_device.bw), within [min, max]_window */
	__u64 min_window;
	__u64 max_window;
	__u64 burst;       /* a process's data stays cache-only until it streamed more */
	__u64 quiet_ns;    /* a process idle this long gets its burst allowance back */
	__u32 window_ms;   /* window_seconds, in milliseconds */
	__u8 mode;         /* enum wb_mode */
	__u8 multi_file;   /* a streaming process's closed files are flushed too */
	__u8 on_battery;   /* enum wb_battery */
	__u8 leave_synced; /* a file its writer fsyncs, fdatasyncs or
	                    * sync_file_range()s is left to that writer */
};

/* What the agent measured of a device: the `devices` hash map, by sb_dev (as
 * in wb_event), with room for WB_DEVICES_MAX of them. */
#define WB_DEVICES_MAX 1024

struct wb_device {
	__u64 bw;          /* write bandwidth estimate, bytes per second */
	__u64 floor;       /* the smallest useful window: one maximal request */
	__u64 batch_closes; /* nonzero: closes of files that never crossed a
	                     * window need not wake the agent (it holds the
	                     * device's dirty cap, or cannot pace the device:
	                     * no pacing to start at the first close) */
	__u64 grain;       /* spans end at multiples of it (a power of two);
	                    * 0: anywhere (see devices.rs, compress_grain) */
	__u64 pool_pages;  /* the burst pool: once the device holds more dirty
	                    * and writeback pages than this, every writer of it
	                    * streams, within its own burst allowance or not;
	                    * 0: not sized yet (devices/decide.rs, pool) */
};

/* A device's burst pool is this many milliseconds of its bandwidth (at
 * least one burst allowance): the agent's estimate, or before the agent has
 * sized it, the kernel's (the bdi's avg_write_bandwidth). */
#define WB_POOL_MS 500

/* Which write syscalls the tracepoint backend's sys_exit hook reports: all
 * of them on the tracepoint backend; on the fentry backend only those whose
 * vfs function could not be hooked on this kernel. */
enum wb_syscalls {
	WB_SC_WRITE = 1,        /* write, pwrite64: vfs_write */
	WB_SC_VECTORED = 2,     /* writev, pwritev, pwritev2: vfs_writev */
	WB_SC_SPLICE = 4,       /* sendfile, splice, copy_file_range: vfs_iter_write */
	WB_SC_ALL = 7,
};

/* The single entry of the `wb_config_map` array map. */
struct wb_config {
	struct wb_policy dflt;  /* cgroups without an entry of their own */
	__u32 on_battery;       /* the host runs on battery now */
	__u32 sys_exit_writes;  /* enum wb_syscalls bits */
};

/*
 * Per-file state in BPF's `streams` map, keyed by the `struct file` address
 * (by the address_space for pages dirtied through a mapping).  Here because
 * the agent reads it too: it recounts what each user holds (owner, touched)
 * when one reaches its share.
 */
struct wb_file_stream {
	__u64 ino;
	__u64 inode;	/* its address: the file is the stream's while f_inode is this */
	__u64 head;	/* everything before head was handed to writeback */
	__u64 mark;	/* everything before mark was counted for the process */
	__u64 pos;	/* end of the last sequential write */
	__u64 window;	/* the device's window, looked up again at each crossing */
	__u32 tgid;
	__u32 spans;	/* spans emitted: the agent holds this file */
	__u32 sb_dev;	/* the file's superblock: its device's window */
	__u32 owner;	/* whose share the entry counts in (see current_owner) */
	__u32 touched;	/* made or last crossed a window, in 2^WB_TOUCH_SHIFT ns
			 * of CLOCK_MONOTONIC */
	__u8 mode;	/* enum wb_mode, from the writer's policy when it started */
	__u8 _pad[3];
};

/* wb_file_stream.touched's unit: 2^30 ns (about 1.07 s), so that the
 * clock fits 32 bits. */
#define WB_TOUCH_SHIFT 30

/* Entries of `streams`; one user (an owner) may hold at most half of them.
 * The `user_streams` hash map (key: the owner's uid, __u32; value: the
 * entries it holds, __s64) counts them; an entry LRU-evicted leaves its
 * count too high, and the agent recounts. */
#define WB_STREAMS_MAX 65536
#define WB_USER_SHARE (WB_STREAMS_MAX / 2)
#define WB_OWNERS_MAX 4096

/* Indices of the per-CPU `stats` array map (summed by the agent). */
enum wb_stat {
	WB_STAT_RB_DROPS = 0,   /* events lost because the ring buffer was full */
	WB_STAT_MAP_FULL = 1,   /* writes not tracked because the stream map was full */
	WB_STAT_CLOSES_SHED = 2, /* closes not reported: the ring buffer was half full */
	WB_STAT_SELF_SYNCED = 3, /* streams left to a writer that syncs the file itself */
	WB_STAT_USER_SHARE = 4, /* files not tracked: their writer's owner holds its share */
	WB_STAT_POOL_SPENT = 5, /* windows and closes of writers within their burst,
	                         * written behind because their device's pool was spent */
	WB_STAT_MAX = 6,
};

/* Each stat's one name, as the agent shows it (`wbctl status`, metrics, its
 * log when it stops). */
#define WB_STAT_NAME_RB_DROPS "ring_buffer_drops"
#define WB_STAT_NAME_MAP_FULL "untracked_map_full"
#define WB_STAT_NAME_CLOSES_SHED "closes_shed"
#define WB_STAT_NAME_SELF_SYNCED "left_self_synced"
#define WB_STAT_NAME_USER_SHARE "untracked_user_share"
#define WB_STAT_NAME_POOL_SPENT "streamed_pool_spent"

#endif /* WRITEBEHIND_H */
