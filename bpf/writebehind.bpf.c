// SPDX-License-Identifier: GPL-2.0
/*
 * Syscall-tracepoint backend: works where fentry is refused (this machine
 * returns EPERM for fentry/lsm loads; kprobes are not built in).
 *
 * Writes are seen at sys_exit, where the return value says how much was
 * written; the arguments come from the task's saved user registers
 * (bpf_task_pt_regs), which the syscall does not modify.  Closes are seen
 * at sys_enter, while the descriptor still names the file.  Process exit is
 * seen at sched_process_exit, which runs before exit_files() drops the fd
 * table.  Each hook only finds the struct file and the byte range and hands
 * them to stream.bpf.h.
 *
 * Covered (strace on Debian 12: dd and tar use write; cp uses read/write
 * across filesystems and copy_file_range within one): write, writev,
 * pwrite64, pwritev, pwritev2, copy_file_range, sendfile64, splice.
 * Not covered: mmap stores, io_uring and AIO (no syscall per write).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "stream.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* pwritev2 flags (uapi/linux/fs.h) that mean the caller syncs or bypasses
 * the cache itself. */
#define RWF_DSYNC	0x02
#define RWF_SYNC	0x04
#define RWF_DONTCACHE	0x80
#define CLOSE_RANGE_CLOEXEC (1U << 2)

/* Closing a range (close_range, process exit) walks at most this many fds. */
#define MAX_FD_WALK	65536

static __always_inline struct pt_regs *user_regs(void)
{
	return (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
}

/* write/writev/sendfile: the file position after the call ends the range. */
static __always_inline void wrote_at_fpos(__s32 fd, long ret)
{
	struct file *file;

	if (ret <= 0)
		return;
	file = current_fd_file(fd);
	if (file) {
		__u64 end = BPF_CORE_READ(file, f_pos);

		stream_write(file, fd, end - ret, end);
	}
}

/* pwrite*: the range starts at an explicit offset. */
static __always_inline void wrote_at(__s32 fd, __u64 pos, long ret)
{
	if (ret > 0)
		stream_write(current_fd_file(fd), fd, pos, pos + ret);
}

/* copy_file_range/splice: offset pointer (updated past the copy) or f_pos. */
static __always_inline void wrote_at_ptr(__s32 fd, __u64 off_ptr, long ret)
{
	__u64 end = 0;

	if (ret <= 0)
		return;
	if (!off_ptr)
		return wrote_at_fpos(fd, ret);
	if (bpf_probe_read_user(&end, sizeof(end), (void *)off_ptr))
		return;
	stream_write(current_fd_file(fd), fd, end - ret, end);
}

SEC("tracepoint/syscalls/sys_exit_write")
int wb_exit_write(struct trace_event_raw_sys_exit *ctx)
{
	wrote_at_fpos(BPF_CORE_READ(user_regs(), di), ctx->ret);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_writev")
int wb_exit_writev(struct trace_event_raw_sys_exit *ctx)
{
	wrote_at_fpos(BPF_CORE_READ(user_regs(), di), ctx->ret);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_pwrite64")
int wb_exit_pwrite64(struct trace_event_raw_sys_exit *ctx)
{
	struct pt_regs *regs = user_regs();

	wrote_at(BPF_CORE_READ(regs, di), BPF_CORE_READ(regs, r10), ctx->ret);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_pwritev")
int wb_exit_pwritev(struct trace_event_raw_sys_exit *ctx)
{
	struct pt_regs *regs = user_regs();

	wrote_at(BPF_CORE_READ(regs, di), BPF_CORE_READ(regs, r10), ctx->ret);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_pwritev2")
int wb_exit_pwritev2(struct trace_event_raw_sys_exit *ctx)
{
	struct pt_regs *regs = user_regs();
	__s32 fd = BPF_CORE_READ(regs, di);
	__s64 pos = BPF_CORE_READ(regs, r10);

	if (BPF_CORE_READ(regs, r9) & (RWF_DSYNC | RWF_SYNC | RWF_DONTCACHE))
		return 0;
	if (pos == -1)
		wrote_at_fpos(fd, ctx->ret);
	else
		wrote_at(fd, pos, ctx->ret);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_copy_file_range")
int wb_exit_copy_file_range(struct trace_event_raw_sys_exit *ctx)
{
	struct pt_regs *regs = user_regs();

	wrote_at_ptr(BPF_CORE_READ(regs, dx), BPF_CORE_READ(regs, r10), ctx->ret);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_splice")
int wb_exit_splice(struct trace_event_raw_sys_exit *ctx)
{
	struct pt_regs *regs = user_regs();

	wrote_at_ptr(BPF_CORE_READ(regs, dx), BPF_CORE_READ(regs, r10), ctx->ret);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_sendfile64")
int wb_exit_sendfile64(struct trace_event_raw_sys_exit *ctx)
{
	wrote_at_fpos(BPF_CORE_READ(user_regs(), di), ctx->ret);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_close")
int wb_enter_close(struct trace_event_raw_sys_enter *ctx)
{
	__s32 fd = ctx->args[0];

	stream_close(current_fd_file(fd), fd);
	return 0;
}

/* dup2/dup3 onto an open descriptor close what it named. */
static __always_inline void dup_over(__s32 oldfd, __s32 newfd)
{
	if (oldfd != newfd)
		stream_close(current_fd_file(newfd), newfd);
}

SEC("tracepoint/syscalls/sys_enter_dup2")
int wb_enter_dup2(struct trace_event_raw_sys_enter *ctx)
{
	dup_over(ctx->args[0], ctx->args[1]);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_dup3")
int wb_enter_dup3(struct trace_event_raw_sys_enter *ctx)
{
	dup_over(ctx->args[0], ctx->args[1]);
	return 0;
}

struct fd_walk {
	struct file **fds;
	__u32 first;
};

static long close_walked(__u32 i, void *data)
{
	struct fd_walk *w = data;
	struct file *file = NULL;
	__u32 fd = w->first + i;

	bpf_probe_read_kernel(&file, sizeof(file), &w->fds[fd]);
	if (file)
		stream_close(file, fd);
	return 0;
}

/* Treat fds [first, last] of task as closed. */
static __always_inline void close_fd_range(struct task_struct *task, __u32 first, __u32 last)
{
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	struct fd_walk w;
	__u32 max;

	if (!fdt)
		return;
	max = BPF_CORE_READ(fdt, max_fds);
	if (last >= max)
		last = max - 1;
	if (first > last || last - first >= MAX_FD_WALK)
		return;
	w.fds = BPF_CORE_READ(fdt, fd);
	w.first = first;
	bpf_loop(last - first + 1, close_walked, &w, 0);
}

SEC("tracepoint/syscalls/sys_enter_close_range")
int wb_enter_close_range(struct trace_event_raw_sys_enter *ctx)
{
	if (ctx->args[2] & CLOSE_RANGE_CLOEXEC)
		return 0;
	close_fd_range(bpf_get_current_task_btf(), ctx->args[0], ctx->args[1]);
	return 0;
}

/* Runs before exit_files(): the last thread of a process closes its table. */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(wb_process_exit, struct task_struct *task, bool group_dead)
{
	if (group_dead)
		close_fd_range(task, 0, MAX_FD_WALK - 1);
	return 0;
}
