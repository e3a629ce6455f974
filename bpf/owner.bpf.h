/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Whose share a writer's entries count in (current_owner), and each
 * owner's count of the `streams` entries it holds (user_streams).
 */
#ifndef OWNER_BPF_H
#define OWNER_BPF_H

#include "compat.bpf.h"
#include "maps.bpf.h"

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

#endif /* OWNER_BPF_H */
