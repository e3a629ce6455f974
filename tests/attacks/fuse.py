# The FUSE protocol as the attack servers need it: mount over /dev/fuse
# (mount(2) itself, as root or inside a user and mount namespace of one's
# own), read requests, answer them.  Prepended to each server's script
# (tests join the two with concat!), which then defines what it serves.
import ctypes
import os
import stat
import struct
import sys
import threading

LOOKUP, FORGET, GETATTR, SETATTR, OPEN, WRITE, RELEASE, FSYNC = 1, 2, 3, 4, 14, 16, 18, 20
FLUSH, INIT, INTERRUPT, BATCH_FORGET = 25, 26, 36, 42
NO_REPLY = (FORGET, BATCH_FORGET, INTERRUPT)
WRITEBACK_CACHE = 1 << 16
ROOT, FILE = 1, 2
ENOENT, ENOSYS = 2, 38


def fuse_mount(mnt, name, options=""):
    """Mounts a fuse.NAME filesystem at MNT; returns /dev/fuse's descriptor."""
    dev = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    libc = ctypes.CDLL(None, use_errno=True)
    opts = f"fd={dev},rootmode=40000,user_id=0,group_id=0{options}".encode()
    if libc.mount(name.encode(), mnt.encode(), f"fuse.{name}".encode(), 6, opts) != 0:  # MS_NOSUID|MS_NODEV
        sys.exit(f"mount: errno {ctypes.get_errno()}")
    return dev


def attr(node, size, file_mode=0o644):
    mode = stat.S_IFDIR | 0o755 if node == ROOT else stat.S_IFREG | file_mode
    # ino size blocks atime mtime ctime (ns x3) mode nlink uid gid rdev blksize flags
    return struct.pack("QQQQQQIIIIIIIIII", node, size, size // 512, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)


def init_reply(body, flags=0):
    """The answer to FUSE_INIT: protocol 7.x (at most 31), 64 KiB writes."""
    _major, minor = struct.unpack_from("II", body)
    # major minor max_readahead flags max_background congestion max_write
    # time_gran max_pages map_alignment flags2 max_stack_depth unused[6]
    return struct.pack("IIIIHHIIHHII", 7, min(minor, 31), 0, flags, 16, 12, 1 << 16, 1, 16, 0, 0, 0) + bytes(24)


def entry(node, size, file_mode=0o644):
    """The answer to a LOOKUP that found NODE, cached for an hour."""
    return struct.pack("QQQQII", node, 0, 3600, 3600, 0, 0) + attr(node, size, file_mode)


def attr_out(node, size, file_mode=0o644):
    """The answer to GETATTR and SETATTR, cached for an hour."""
    return struct.pack("QII", 3600, 0, 0) + attr(node, size, file_mode)


def reply(dev, unique, payload=b"", error=0):
    os.write(dev, struct.pack("IiQ", 16 + len(payload), -error, unique) + payload)


def requests(dev):
    """Each request: (opcode, unique, node id, the body after the header);
    the requesting thread's pid in REQUEST_PID."""
    global REQUEST_PID
    while True:
        req = os.read(dev, 1 << 21)
        _len, op, unique, node = struct.unpack_from("IIQQ", req)
        REQUEST_PID = struct.unpack_from("I", req, 32)[0]
        yield op, unique, node, req[40:]


def serve_file(dev, op, unique, node, body, size_of):
    """Answers what a one-file filesystem of writable "f" answers alike:
    LOOKUP, GETATTR, SETATTR (SIZE_OF holds the sizes by node) and OPEN.
    False for any other request, which the caller answers."""
    if op == LOOKUP:
        if node == ROOT and body.rstrip(b"\0") == b"f":
            reply(dev, unique, entry(FILE, size_of[FILE], 0o666))
        else:
            reply(dev, unique, error=ENOENT)
    elif op in (GETATTR, SETATTR):
        if op == SETATTR and struct.unpack_from("I", body)[0] & (1 << 3):  # FATTR_SIZE
            size_of[node] = struct.unpack_from("Q", body, 16)[0]
        reply(dev, unique, attr_out(node, size_of[node], 0o666))
    elif op == OPEN:
        reply(dev, unique, struct.pack("QII", 0, 0, 0))
    else:
        return False
    return True


def serve_one_file(dev, writer, write, flush=lambda: True):
    """Serves a one-file filesystem of writable "f" with the writeback
    cache until killed: WRITER starts on a thread at INIT; WRITE(n) says
    whether a write of N bytes is answered (it may take its time), FLUSH()
    whether a FLUSH is."""
    size_of = {ROOT: 0, FILE: 0}
    for op, unique, node, body in requests(dev):
        if op == INIT:
            reply(dev, unique, init_reply(body, WRITEBACK_CACHE))
            threading.Thread(target=writer, daemon=True).start()
        elif serve_file(dev, op, unique, node, body, size_of):
            pass
        elif op == WRITE:
            _fh, offset, n = struct.unpack_from("QQI", body)
            if write(n):
                size_of[FILE] = max(size_of[FILE], offset + n)
                reply(dev, unique, struct.pack("II", n, 0))
        elif op == FLUSH:
            if flush():
                reply(dev, unique)
        elif op in (RELEASE, FSYNC):
            reply(dev, unique)
        elif op in NO_REPLY:
            pass
        else:
            reply(dev, unique, error=ENOSYS)
