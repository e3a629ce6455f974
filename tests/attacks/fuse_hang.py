# A FUSE filesystem with one regular file, "f", whose every open hangs: the
# server never answers FUSE_OPEN (a user's FUSE server can do that at will;
# on a distribution any user mounts one with fusermount3).  Mounts at the
# given directory with allow_other, prints "ready", serves until killed.
#   fuse_hang.py MOUNTPOINT  (after fuse.py)
dev = fuse_mount(sys.argv[1], "wbhang", ",allow_other")
print("ready", flush=True)
for op, unique, node, body in requests(dev):
    if op == INIT:
        reply(dev, unique, init_reply(body))
    elif op == LOOKUP:
        if node == ROOT and body.rstrip(b"\0") == b"f":
            reply(dev, unique, entry(FILE, 1 << 20))
        else:
            reply(dev, unique, error=ENOENT)
    elif op == GETATTR:
        reply(dev, unique, attr_out(node, 1 << 20))
    elif op == OPEN:
        pass  # never answered: whoever opens "f" waits for ever
    elif op in NO_REPLY:
        pass  # an interrupted open still gets no answer
    else:
        reply(dev, unique, error=ENOSYS)
