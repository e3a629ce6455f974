/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Stream logic, shared by every hook backend: the hooks only find the
 * `struct file` and the byte range a write touched, then call
 * stream_write() / stream_close().  Here: the state machine of a stream
 * (stream_advance, _write, _dirtied, _close, _synced) and proc_exit; what
 * it uses is in the headers it includes, in this order.
 *
 * Hot-path rules (one global lock on a per-write path turned 30 cp's into a
 * spinlock benchmark): a write only does lockless lookups and in-place
 * updates.  Locks are taken only when a file's state is created (a per-bucket
 * hash lock) and when an event is emitted (the ring buffer, once per window).
 */
#ifndef STREAM_BPF_H
#define STREAM_BPF_H

#include "writebehind.h"
#include "compat.bpf.h"
#include "maps.bpf.h"
#include "files.bpf.h"
#include "policy.bpf.h"
#include "owner.bpf.h"
#include "emit.bpf.h"

/* The entry's clock (wb_file_stream.touched): 2^WB_TOUCH_SHIFT ns. */
static __always_inline __u32 touch_now(void)
{
	return bpf_ktime_get_ns() >> WB_TOUCH_SHIFT;
}

/* A page dirtied this far past a mapped stream's end still continues it:
 * the dirtied folio may be large, and only its first page is counted. */
#define DIRTY_GAP (2ULL << 20)

/*
 * Whether the device behind sb_dev (its bdi: bdi) holds more than its burst
 * pool (wb_device.pool_pages): then a writer within its own burst allowance
 * (pol's) streams too.  The allowance is for one process's short-lived
 * files; a hundred dd of 8 MiB each, each within its 16 MiB, held 793 MiB
 * dirty on a 100 MiB/s device, unseen: the agent had no entry for the
 * device, so a device it has not sized gets WB_POOL_MS of the kernel's
 * estimate.  Read at window crossings and closes only, as the policy is;
 * counted when it decides (WB_STAT_POOL_SPENT).  Pages are taken as 4 KiB
 * for the burst's floor (on larger pages the pool is only larger).
 */
static __always_inline bool pool_spent(__u32 sb_dev, struct backing_dev_info *bdi, struct wb_policy *pol)
{
	struct wb_device *d = bpf_map_lookup_elem(&devices, &sb_dev);
	__s64 pages = bdi_dirty_pages(bdi);
	__u64 pool = d ? d->pool_pages : 0;

	if (pages <= 0)
		return false;
	if (!pool) {
		pool = BPF_CORE_READ(bdi, wb.avg_write_bandwidth) * WB_POOL_MS / 1000;
		if (pool < pol->burst >> 12)
			pool = pol->burst >> 12;
	}
	if ((__u64)pages <= pool)
		return false;
	stat_inc(WB_STAT_POOL_SPENT);
	return true;
}

/* Whether the current process streams with `bytes` more of sequential data
 * to the device behind sb_dev (pol its policy): beyond its burst allowance,
 * or within it on a device whose pool is spent.  `file`: the write's open
 * file (NULL for a mapped stream), whose bdi is its disk's when it is a
 * block device's node.  The device is read only for a process within its
 * allowance. */
static __always_inline bool writer_streams(struct wb_policy *pol, __u64 bytes, __u32 sb_dev, struct inode *inode,
					   struct file *file)
{
	bool blk;

	if (proc_streaming(pol, bytes))
		return true;
	blk = file && (BPF_CORE_READ(inode, i_mode) & S_IFMT) == S_IFBLK;
	return pool_spent(sb_dev, writer_bdi(inode, blk ? file : NULL), pol);
}

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
			.sb_dev = facts->blk_dev ?: BPF_CORE_READ(sb, s_dev),
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
	if (s->mode == WB_MODE_OFF || !writer_streams(pol, end - s->mark, s->sb_dev, facts->inode, file)) {
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
		emit(WB_EV_SPAN, file, fd, facts->ino, s->head, end, false, s->mode);
	else
		emit_inode(WB_EV_SPAN, facts->inode, NULL, -1, facts->ino, s->head, end, false, s->mode);
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
	else if (!inode_eligible(facts.inode, &facts, true))
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

	if (!BPF_CORE_READ(host, i_fop, write_iter) || !inode_eligible(host, &facts, false))
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
		tail = writer_streams(pol, s->pos - s->mark, s->sb_dev, BPF_CORE_READ(file, f_inode), file) &&
		       (s->spans || pol->multi_file);
	}
	if ((tail || s->spans) && s->ino == BPF_CORE_READ(file, f_inode, i_ino)) {
		if (!s->spans && ring_crowded())
			stat_inc(WB_STAT_CLOSES_SHED);
		else
			emit_close(file, fd, s->ino, s->head, tail ? s->pos : s->head, !s->spans, s->mode);
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
