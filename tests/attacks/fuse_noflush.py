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

mnt, size = sys.argv[1], int(sys.argv[2])
dev = fuse_mount(mnt, "wbnoflush", ",allow_other")
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


# Anyone else's close waits for ever.
serve_one_file(dev, writer, write=lambda n: True, flush=lambda: REQUEST_PID == writer_pid)
