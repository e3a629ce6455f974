# Four processes each open a file 18,000 times (a struct file, so an entry
# of BPF's stream map, each: 72,000, more than the map holds) and write a
# byte through each descriptor in turn, for argv[2] seconds.  With
# --userns, they run as uids 1-4 of a user namespace made here, which the
# caller maps (as newuidmap would): prints its pid and waits for the
# mapping first.  Prints "ready" once every descriptor is open, "failed"
# (and exits 1) if a process could not get there.
import ctypes, os, resource, sys, time

CLONE_NEWUSER = 0x10000000
d, seconds, userns = sys.argv[1], float(sys.argv[2]), "--userns" in sys.argv
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
if userns:
    if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWUSER) != 0:
        sys.exit(f"unshare: {os.strerror(ctypes.get_errno())}")
    print(os.getpid(), flush=True)
    deadline = time.monotonic() + 10
    while not open("/proc/self/uid_map").read().strip():
        if time.monotonic() > deadline:
            sys.exit("no uid_map within 10 s")
        time.sleep(0.01)
ready_r, ready_w = os.pipe()
for n in range(4):
    if os.fork() == 0:
        try:
            os.close(ready_r)
            if userns:
                os.setresuid(n + 1, n + 1, n + 1)
            fds = [os.open(f"{d}/churn{n}", os.O_WRONLY | os.O_CREAT, 0o666) for _ in range(18000)]
            os.write(ready_w, b"r")
            os.close(ready_w)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for fd in fds:
                    os.write(fd, b"x")
        except BaseException as e:
            print(f"churn {n}: {e}", file=sys.stderr, flush=True)
            os._exit(1)
        os._exit(0)
os.close(ready_w)
got = b""
while len(got) < 4:
    more = os.read(ready_r, 4 - len(got))
    if not more:
        print("failed", flush=True)
        sys.exit(1)
    got += more
print("ready", flush=True)
for _ in range(4):
    os.wait()
