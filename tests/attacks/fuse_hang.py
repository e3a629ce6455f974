# A FUSE filesystem with one regular file, "f", whose every open hangs: the
# server never answers FUSE_OPEN (a user's FUSE server can do that at will;
# on a distribution any user mounts one with fusermount3).  Mounts at the
# given directory with allow_other, prints "ready", serves until killed.
#   fuse_hang.py MOUNTPOINT
import ctypes
import os
import stat
import struct
import sys

mnt = sys.argv[1]
dev = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
libc = ctypes.CDLL(None, use_errno=True)
opts = f"fd={dev},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
if libc.mount(b"wbhang", mnt.encode(), b"fuse.wbhang", 6, opts) != 0:  # MS_NOSUID|MS_NODEV
    sys.exit(f"mount: errno {ctypes.get_errno()}")

FUSE_LOOKUP, FUSE_GETATTR, FUSE_OPEN, FUSE_INIT = 1, 3, 14, 26
FUSE_FORGET, FUSE_BATCH_FORGET, FUSE_INTERRUPT = 2, 42, 36
ROOT, FILE = 1, 2
ENOENT, ENOSYS = 2, 38


def attr(node):
    mode = stat.S_IFDIR | 0o755 if node == ROOT else stat.S_IFREG | 0o644
    # ino size blocks atime mtime ctime (ns x3) mode nlink uid gid rdev blksize flags
    return struct.pack("QQQQQQIIIIIIIIII", node, 1 << 20, 2048, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)


def reply(unique, payload=b"", error=0):
    os.write(dev, struct.pack("IiQ", 16 + len(payload), -error, unique) + payload)


print("ready", flush=True)
while True:
    req = os.read(dev, 1 << 20)
    _len, op, unique, node = struct.unpack_from("IIQQ", req)
    body = req[40:]
    if op == FUSE_INIT:
        major, minor = struct.unpack_from("II", body)
        # major minor max_readahead flags max_background congestion max_write
        # time_gran max_pages map_alignment flags2 max_stack_depth unused[6]
        out = struct.pack("IIIIHHIIHHII", 7, min(minor, 31), 0, 0, 16, 12, 1 << 16, 1, 16, 0, 0, 0) + bytes(24)
        reply(unique, out)
    elif op == FUSE_LOOKUP:
        if node == ROOT and body.rstrip(b"\0") == b"f":
            reply(unique, struct.pack("QQQQII", FILE, 0, 3600, 3600, 0, 0) + attr(FILE))
        else:
            reply(unique, error=ENOENT)
    elif op == FUSE_GETATTR:
        reply(unique, struct.pack("QII", 3600, 0, 0) + attr(node))
    elif op == FUSE_OPEN:
        pass  # never answered: whoever opens "f" waits for ever
    elif op in (FUSE_FORGET, FUSE_BATCH_FORGET, FUSE_INTERRUPT):
        pass  # no reply expected (an interrupted open still gets none)
    else:
        reply(unique, error=ENOSYS)
