# A user's own FUSE filesystem whose server takes writes at a rate it
# chooses, with the kernel's writeback cache (so the page cache holds its
# dirty pages, as for a disk).  Run as an unprivileged user inside
# `unshare -Urm`: a mount no root made, in a namespace of the user's.
# Mounts at MOUNTPOINT, then runs `dd` of MIB MiB into MOUNTPOINT/f (in the
# same namespace), serving until dd ends; prints "done" and exits.  With
# STALL_AFTER, the server stops answering writes once it took that many MiB
# (a server that hangs: whoever waits for that writeback waits for ever).
#   fuse_slow.py MOUNTPOINT MIB_PER_SEC MIB [STALL_AFTER]
import ctypes
import os
import stat
import struct
import subprocess
import sys
import threading
import time

mnt, rate, size = sys.argv[1], int(sys.argv[2]) << 20, int(sys.argv[3])
stall = int(sys.argv[4]) << 20 if len(sys.argv) > 4 else None
dev = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
libc = ctypes.CDLL(None, use_errno=True)
opts = f"fd={dev},rootmode=40000,user_id=0,group_id=0".encode()
if libc.mount(b"wbslow", mnt.encode(), b"fuse.wbslow", 6, opts) != 0:  # MS_NOSUID|MS_NODEV
    sys.exit(f"mount: errno {ctypes.get_errno()}")

LOOKUP, FORGET, GETATTR, SETATTR, OPEN, WRITE, RELEASE, FSYNC = 1, 2, 3, 4, 14, 16, 18, 20
FLUSH, INIT, INTERRUPT, BATCH_FORGET = 25, 26, 36, 42
WRITEBACK_CACHE = 1 << 16
ROOT, FILE = 1, 2
ENOENT, ENOSYS = 2, 38
size_of = {ROOT: 0, FILE: 0}


def attr(node):
    mode = stat.S_IFDIR | 0o755 if node == ROOT else stat.S_IFREG | 0o666
    # ino size blocks atime mtime ctime (ns x3) mode nlink uid gid rdev blksize flags
    n = size_of[node]
    return struct.pack("QQQQQQIIIIIIIIII", node, n, n // 512, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)


def reply(unique, payload=b"", error=0):
    os.write(dev, struct.pack("IiQ", 16 + len(payload), -error, unique) + payload)


def writer():
    subprocess.run(["dd", "if=/dev/zero", f"of={mnt}/f", "bs=1M", f"count={size}", "conv=notrunc", "status=none"])
    subprocess.run(["sync", "-f", f"{mnt}/f"])
    print("done", flush=True)
    os._exit(0)


served, t0 = 0, None
while True:
    req = os.read(dev, 1 << 21)
    _len, op, unique, node = struct.unpack_from("IIQQ", req)
    body = req[40:]
    if op == INIT:
        _major, minor = struct.unpack_from("II", body)
        # major minor max_readahead flags max_background congestion max_write
        # time_gran max_pages map_alignment flags2 max_stack_depth unused[6]
        out = struct.pack("IIIIHHIIHHII", 7, min(minor, 31), 0, WRITEBACK_CACHE, 16, 12, 1 << 16, 1, 16, 0, 0, 0)
        reply(unique, out + bytes(24))
        threading.Thread(target=writer, daemon=True).start()
    elif op == LOOKUP:
        if node == ROOT and body.rstrip(b"\0") == b"f":
            reply(unique, struct.pack("QQQQII", FILE, 0, 3600, 3600, 0, 0) + attr(FILE))
        else:
            reply(unique, error=ENOENT)
    elif op in (GETATTR, SETATTR):
        if op == SETATTR:
            valid, = struct.unpack_from("I", body)
            if valid & (1 << 3):  # FATTR_SIZE
                size_of[node] = struct.unpack_from("Q", body, 16)[0]
        reply(unique, struct.pack("QII", 3600, 0, 0) + attr(node))
    elif op == OPEN:
        reply(unique, struct.pack("QII", 0, 0, 0))
    elif op == WRITE:
        _fh, offset, n = struct.unpack_from("QQI", body)
        if stall is not None and served >= stall:
            continue  # never answered
        size_of[FILE] = max(size_of[FILE], offset + n)
        # The server's speed is the user's to choose.
        t0 = t0 or time.monotonic()
        served += n
        time.sleep(max(0.0, t0 + served / rate - time.monotonic()))
        reply(unique, struct.pack("II", n, 0))
    elif op in (FLUSH, RELEASE, FSYNC):
        reply(unique)
    elif op in (FORGET, BATCH_FORGET, INTERRUPT):
        pass  # no reply expected
    else:
        reply(unique, error=ENOSYS)
