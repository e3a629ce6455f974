# A FUSE filesystem whose server answers FLUSH only from its own writer:
# FUSE's every close of a file writes its dirty pages, sends FLUSH and
# waits for the reply, so any other process that opens the file and closes
# it waits until the server dies (a user's own server can do that at will;
# on a distribution any user mounts one with fusermount3).  Mounts at
# MOUNTPOINT with allow_other and the writeback cache; a writer writes MIB
# MiB into MOUNTPOINT/f, waits 2 s (the daemon is done with its windows)
# and exits without closing it (a stream that ends at its writer's exit);
# prints "done" then, and serves until killed.
#   fuse_noflush.py MOUNTPOINT MIB  (after fuse.py)
import subprocess
import threading

mnt, size = sys.argv[1], int(sys.argv[2])
dev = fuse_mount(mnt, "wbnoflush", ",allow_other")
size_of = {ROOT: 0, FILE: 0}
writer_pid = None


WRITER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)
for _ in range(int(sys.argv[2])):
    os.write(fd, bytes(1 << 20))
time.sleep(2)
os._exit(0)
"""


def writer():
    global writer_pid
    w = subprocess.Popen([sys.executable, "-c", WRITER, f"{mnt}/f", str(size)])
    writer_pid = w.pid
    w.wait()
    print("done", flush=True)


for op, unique, node, body in requests(dev):
    if op == INIT:
        reply(dev, unique, init_reply(body, WRITEBACK_CACHE))
        threading.Thread(target=writer, daemon=True).start()
    elif serve_file(dev, op, unique, node, body, size_of):
        pass
    elif op == WRITE:
        _fh, offset, n = struct.unpack_from("QQI", body)
        size_of[FILE] = max(size_of[FILE], offset + n)
        reply(dev, unique, struct.pack("II", n, 0))
    elif op == FLUSH:
        if REQUEST_PID == writer_pid:
            reply(dev, unique)
        # anyone else's close waits for ever
    elif op in (RELEASE, FSYNC):
        reply(dev, unique)
    elif op in NO_REPLY:
        pass
    else:
        reply(dev, unique, error=ENOSYS)
