/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Events to the agent: a record of the writer, the file and its device,
 * when it wakes the agent, and a close's path beneath its mount on
 * filesystems without file handles.
 */
#ifndef EMIT_BPF_H
#define EMIT_BPF_H

#include "maps.bpf.h"
#include "files.bpf.h"
#include "owner.bpf.h"

/* The btrfs_inode around inode, or NULL on other filesystems (or kernels
 * without btrfs): btrfs keeps per-subvolume facts there. */
static __always_inline struct btrfs_inode *btrfs_inode_of(struct inode *inode, __u32 magic)
{
	if (!bpf_core_type_exists(struct btrfs_inode) || magic != BTRFS_SUPER_MAGIC)
		return NULL;
	return (void *)inode - bpf_core_field_offset(struct btrfs_inode, vfs_inode);
}

/* 5.10-5.14 keep a block device's bdi in the device, not in its disk. */
struct block_device___old {
	struct backing_dev_info *bd_bdi;
} __attribute__((preserve_access_index));

/* The bdi of the disk whose block device `file` is open on: the file's
 * mapping is the device's own page cache, whose host is the inode inside
 * the device's struct bdev_inode.  NULL if this kernel lays it out
 * otherwise. */
static __always_inline struct backing_dev_info *blkdev_bdi(struct file *file)
{
	struct inode *host = BPF_CORE_READ(file, f_mapping, host);
	struct block_device *bdev;

	if (!host || !bpf_core_type_exists(struct bdev_inode))
		return NULL;
	bdev = (void *)host - bpf_core_field_offset(struct bdev_inode, vfs_inode) +
	       bpf_core_field_offset(struct bdev_inode, bdev);
	if (bpf_core_field_exists(struct gendisk, bdi))
		return BPF_CORE_READ(bdev, bd_disk, bdi);
	return BPF_CORE_READ((struct block_device___old *)bdev, bd_bdi);
}

/* The bdi a write to inode dirties: its filesystem's, or for `blk_file`
 * (a block device node's open file, else NULL) its disk's. */
static __always_inline struct backing_dev_info *writer_bdi(struct inode *inode, struct file *blk_file)
{
	return blk_file ? blkdev_bdi(blk_file) : BPF_CORE_READ(inode, i_sb, s_bdi);
}

/* The bdi's dirty and writeback pages (its root wb's: with cgroup
 * writeback, a cgroup's own wb counts apart). */
static __always_inline __s64 bdi_dirty_pages(struct backing_dev_info *bdi)
{
	if (!bdi)
		return 0;
	return BPF_CORE_READ(bdi, wb.stat[0].count) +	/* WB_RECLAIMABLE */
	       BPF_CORE_READ(bdi, wb.stat[1].count);	/* WB_WRITEBACK */
}

/* Everything an event says of the writer, the file and its device.  `file`
 * (NULL where only the inode is known) names a block device's node's open
 * file: the device is then its disk's (WB_BLOCK_DEVICE_MAGIC). */
static __always_inline void fill_event(struct wb_event *e, __u32 kind, struct inode *inode, struct file *file,
				       __s32 fd, __u64 ino, __u64 start, __u64 end, __u8 mode)
{
	struct backing_dev_info *bdi;
	struct btrfs_inode *bi;
	bool blk = file && (BPF_CORE_READ(inode, i_mode) & S_IFMT) == S_IFBLK;

	e->kind = kind;
	e->mode = mode;
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
	if (blk) {
		e->fs_magic = WB_BLOCK_DEVICE_MAGIC;
		e->sb_dev = e->st_dev = BPF_CORE_READ(inode, i_rdev);
		e->fs_root = 0;
	}
	bdi = writer_bdi(inode, blk ? file : NULL);
	/* A reserved record is not zeroed: an unread name must not be the
	 * previous record's. */
	e->bdi[0] = 0;
	bpf_probe_read_kernel_str(e->bdi, sizeof(e->bdi), bdi->dev_name);
	e->bdi_bw_pages = BPF_CORE_READ(bdi, wb.avg_write_bandwidth);
	e->bdi_dirty_pages = bdi_dirty_pages(bdi);
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
 * (the agent then reaches the inode by handle).  mode: the stream's. */
static __always_inline void emit_inode(__u32 kind, struct inode *inode, struct file *file, __s32 fd,
				       __u64 ino, __u64 start, __u64 end, bool batched, __u8 mode)
{
	struct wb_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		stat_inc(WB_STAT_RB_DROPS);
		return;
	}
	fill_event(e, kind, inode, file, fd, ino, start, end, mode);
	bpf_ringbuf_submit(e, wakeup(batched));
}

/* An event about file: a span names the writer's descriptor, looked up if
 * the hook did not see one. */
static __always_inline void emit(__u32 kind, struct file *file, __s32 fd,
				 __u64 ino, __u64 start, __u64 end, bool batched, __u8 mode)
{
	if (fd < 0 && kind == WB_EV_SPAN)
		fd = current_fd_of(file);
	emit_inode(kind, BPF_CORE_READ(file, f_inode), file, fd, ino, start, end, batched, mode);
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
				       bool batched, __u8 mode)
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
		emit(WB_EV_CLOSE, file, fd, ino, start, end, batched, mode);
		return;
	}
	pe = bpf_ringbuf_reserve(&events, sizeof(*pe), 0);
	if (!pe) {
		/* No room for the path: the plain close still lets the agent
		 * go of a file it holds. */
		emit(WB_EV_CLOSE, file, fd, ino, start, end, batched, mode);
		return;
	}
	if (!fill_path(pe->names, file)) {
		/* Sent without its path: the agent counts it unreachable
		 * (and lets go of the file if it held it). */
		bpf_ringbuf_discard(pe, 0);
		emit(WB_EV_CLOSE, file, fd, ino, start, end, batched, mode);
		return;
	}
	fill_event(&pe->ev, WB_EV_CLOSE_PATH, BPF_CORE_READ(file, f_inode), file, fd, ino, start, end, mode);
	bpf_ringbuf_submit(pe, wakeup(batched));
}

#endif /* EMIT_BPF_H */
