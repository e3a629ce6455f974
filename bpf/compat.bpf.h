/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What the programs take from the kernel beyond vmlinux.h: the compat
 * object's stand-ins for what older kernels lack (WB_COMPAT), and the
 * kernel's macro constants, which BTF does not carry.
 */
#ifndef COMPAT_BPF_H
#define COMPAT_BPF_H

/*
 * Kernels before 5.13 (Debian 11's 5.10) refuse a program that merely names
 * a callback (bpf_loop's, 5.17) and have no bpf_get_current_task_btf (5.11);
 * 5.15 (Ubuntu 22.04) has the second but not bpf_loop.  build.rs also
 * compiles the programs with -DWB_COMPAT, and the loader takes that object
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
#define S_IFBLK		0060000
#define BTRFS_SUPER_MAGIC 0x9123683E
#define BDI_CAP_WRITEBACK 0x1	/* include/linux/backing-dev.h */

#endif /* COMPAT_BPF_H */
