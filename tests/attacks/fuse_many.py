# Many FUSE filesystems one user mounts in a user and mount namespace of
# their own (`unshare -rm`: FUSE allows it), each a device of its own (a bdi
# 0:NN) that the daemon's mount table does not list, and a writer that
# streams into each: 20 MiB into the first (past its burst allowance), then
# 4 MiB into each of the others, closing each.  Mounts BASE/m0 ..
# BASE/m{N-1} through the FUSE device node NODE (a distribution's
# /dev/fuse is 0666; here the test makes such a node), prints "done" once
# every file is closed, and serves until killed (its mounts go with its
# namespace).
#   fuse_many.py BASE N NODE  (after fuse.py)
import subprocess

base, count, node = sys.argv[1], int(sys.argv[2]), sys.argv[3]
libc = ctypes.CDLL(None, use_errno=True)


def user_mount(mnt):
    """Mounts MNT; returns the FUSE device's descriptor."""
    dev = os.open(node, os.O_RDWR | os.O_CLOEXEC)
    opts = f"fd={dev},rootmode=40000,user_id=0,group_id=0".encode()
    if libc.mount(b"wbmany", mnt.encode(), b"fuse.wbmany", 6, opts) != 0:  # MS_NOSUID|MS_NODEV
        sys.exit(f"mount {mnt}: errno {ctypes.get_errno()}")
    return dev


def serve(dev):
    serve_one_file(dev, lambda: None, write=lambda n: True)


for i in range(count):
    mnt = f"{base}/m{i}"
    os.makedirs(mnt, exist_ok=True)
    threading.Thread(target=serve, args=(user_mount(mnt),), daemon=True).start()

WRITER = """
import os, sys
for i, mnt in enumerate(sys.argv[1:]):
    fd = os.open(mnt + "/f", os.O_WRONLY | os.O_CREAT)
    for _ in range(20 if i == 0 else 4):
        os.write(fd, bytes(1 << 20))
    os.close(fd)
"""
subprocess.run([sys.executable, "-c", WRITER] + [f"{base}/m{i}" for i in range(count)], check=True)
print("done", flush=True)
threading.Event().wait()
