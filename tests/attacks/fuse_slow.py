# A user's own FUSE filesystem whose server takes writes at a rate it
# chooses, with the kernel's writeback cache (so the page cache holds its
# dirty pages, as for a disk).  Run as an unprivileged user inside
# `unshare -Urm` (a mount no root made, in a namespace of the user's), or
# as root in the daemon's namespace (hardening.rs, RootFuse).
# Mounts at MOUNTPOINT, then runs `dd` of MIB MiB into MOUNTPOINT/f (in the
# same namespace), serving until dd ends; prints "done" and exits.  With
# STALL_AFTER, the server stops answering writes once it took that many MiB
# (a server that hangs: whoever waits for that writeback waits for ever).
#   fuse_slow.py MOUNTPOINT MIB_PER_SEC MIB [STALL_AFTER]  (after fuse.py)
import subprocess
import time

mnt, rate, size = sys.argv[1], int(sys.argv[2]) << 20, int(sys.argv[3])
stall = int(sys.argv[4]) << 20 if len(sys.argv) > 4 else None
dev = fuse_mount(mnt, "wbslow")


def writer():
    subprocess.run(["dd", "if=/dev/zero", f"of={mnt}/f", "bs=1M", f"count={size}", "conv=notrunc", "status=none"])
    subprocess.run(["sync", "-f", f"{mnt}/f"])
    print("done", flush=True)
    os._exit(0)


served, t0 = 0, None


def write(n):
    global served, t0
    if stall is not None and served >= stall:
        return False  # never answered
    # The server's speed is the user's to choose.
    t0 = t0 or time.monotonic()
    served += n
    time.sleep(max(0.0, t0 + served / rate - time.monotonic()))
    return True


serve_one_file(dev, writer, write)
