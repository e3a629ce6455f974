# Four processes of one user each open a file 18,000 times (a struct file,
# so an entry of BPF's stream map, each: 72,000, more than the map holds)
# and write a byte through each descriptor in turn, for argv[2] seconds.
# With --userns, they run as four uids of a user namespace this user made,
# its uids 1-4 mapped (by root, as newuidmap would) to subordinate uids:
# prints its pid and waits for the mapping first.  Prints "ready" once
# every descriptor is open.
import ctypes, os, resource, sys, time

CLONE_NEWUSER = 0x10000000
d, seconds, userns = sys.argv[1], float(sys.argv[2]), "--userns" in sys.argv
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
if userns:
    if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWUSER) != 0:
        sys.exit(f"unshare: {os.strerror(ctypes.get_errno())}")
    print(os.getpid(), flush=True)
    while not open("/proc/self/uid_map").read().strip():
        time.sleep(0.01)
ready_r, ready_w = os.pipe()
for n in range(4):
    if os.fork() == 0:
        if userns:
            os.setresuid(n + 1, n + 1, n + 1)
        fds = [os.open(f"{d}/churn{n}", os.O_WRONLY | os.O_CREAT, 0o666) for _ in range(18000)]
        os.write(ready_w, b"r")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for fd in fds:
                os.write(fd, b"x")
        os._exit(0)
for _ in range(4):
    os.read(ready_r, 1)
print("ready", flush=True)
for _ in range(4):
    os.wait()
