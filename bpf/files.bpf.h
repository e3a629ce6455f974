/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What the hooks and the stream logic learn of a file: the file behind a
 * descriptor and the descriptor of a file (the fd table), and whether
 * write-behind may act on it (its inode and open file), each kernel object
 * read with as few probe reads as possible.
 */
#ifndef FILES_BPF_H
#define FILES_BPF_H

#include "compat.bpf.h"

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
	/* A block device's own number (kernel encoding), 0 for a file: its
	 * stream's device is then its superblock's. */
	__u32 blk_dev;
};

/*
 * What write-behind may act on, filling `facts`.  Excluded: by the inode
 * (inode_eligible), anything but a regular file, and files on a bdi without
 * writeback (tmpfs, ramfs: nothing to write back to), but for a write
 * syscall's block device node (`blk_ok`: dd of=/dev/sdb, whose last close
 * writes the whole device back; never a page dirtied outside a write, which
 * on a block device is a mounted filesystem's metadata); by the open file
 * (file_writable), O_DIRECT, O_SYNC/O_DSYNC and POSIX_FADV_RANDOM (those
 * writers manage their own writeback).  A page dirtied through a mapping or
 * io_uring has no file at hand: only its inode is checked.
 */
static __always_inline bool inode_eligible(struct inode *inode, struct file_facts *facts, bool blk_ok)
{
	struct super_block *sb;
	char iblk[72];
	umode_t imode;

	facts->inode = inode;
	if (bpf_probe_read_kernel(iblk, sizeof(iblk), inode))
		return false;
	imode = BLK_FIELD(iblk, inode, struct inode, i_mode);
	if ((imode & S_IFMT) == S_IFBLK && blk_ok) {
		/* Every disk's bdi writes back. */
		facts->ino = BLK_FIELD(iblk, inode, struct inode, i_ino);
		facts->sb = BLK_FIELD(iblk, inode, struct inode, i_sb);
		facts->blk_dev = BLK_FIELD(iblk, inode, struct inode, i_rdev);
		return facts->blk_dev != 0;
	}
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

#endif /* FILES_BPF_H */
