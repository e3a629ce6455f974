# A FUSE filesystem with one regular file, "img": a disk image of SIZE MiB
# held in memory, read and written as a loop device over it needs (a disk
# image on a user's sshfs).  Its entries are never cached, so every path
# walk to the image asks the server; after SIGUSR1 it answers no LOOKUP
# (a user's own server can do that at will, and an automount to a server a
# user picks does the same), while the image's reads and writes go on.
# Mounts at MOUNTPOINT with allow_other, prints "ready", serves until killed.
#   fuse_image.py MOUNTPOINT SIZE_MIB  (after fuse.py)
import signal

READ = 15
size = int(sys.argv[2]) << 20
image = bytearray(size)
silent = False


def go_silent(_sig, _frame):
    global silent
    silent = True


signal.signal(signal.SIGUSR1, go_silent)
dev = fuse_mount(sys.argv[1], "wbimage", ",allow_other")
print("ready", flush=True)
for op, unique, node, body in requests(dev):
    if op == INIT:
        reply(dev, unique, init_reply(body))
    elif op == LOOKUP:
        if silent:
            pass  # never answered: whoever walks to the image waits
        elif node == ROOT and body.rstrip(b"\0") == b"img":
            # nodeid generation entry_valid attr_valid (s, ns): the entry
            # is never cached, its attributes are.
            reply(dev, unique, struct.pack("QQQQII", FILE, 0, 0, 3600, 0, 0) + attr(FILE, size))
        else:
            reply(dev, unique, error=ENOENT)
    elif op == GETATTR:
        reply(dev, unique, attr_out(node, size))
    elif op == OPEN:
        reply(dev, unique, struct.pack("QII", 0, 0, 0))
    elif op == READ:
        _fh, offset, n = struct.unpack_from("QQI", body)
        reply(dev, unique, bytes(image[offset:offset + n]))
    elif op == WRITE:
        # fuse_write_in is 40 bytes; the data follows.
        _fh, offset, n = struct.unpack_from("QQI", body)
        image[offset:offset + n] = body[40:40 + n]
        reply(dev, unique, struct.pack("II", n, 0))
    elif op in (FLUSH, RELEASE, FSYNC):
        reply(dev, unique)
    elif op in NO_REPLY:
        pass
    else:
        reply(dev, unique, error=ENOSYS)
