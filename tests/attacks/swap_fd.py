# A writer that streams a file and, between its writes, puts something else
# at the same descriptor number: an O_PATH descriptor (which needs no read
# permission) of each path given after the file, in turn.  Run unprivileged.
#   swap_fd.py FILE SECONDS TRAP...
import os
import sys
import time

path, seconds, traps = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
keep = os.dup(fd)
others = [os.open(t, os.O_PATH) for t in traps]
block = b"w" * (1 << 20)
end = time.monotonic() + seconds
i = 0
while time.monotonic() < end:
    # Putting the file back at `fd` looks like a new file to BPF (dup2 over
    # a descriptor is a close): its first write only starts tracking, the
    # second crosses a window, and that event names `fd`.
    os.dup2(keep, fd)
    os.write(fd, block)
    os.write(fd, block)
    os.dup2(others[i % len(others)], fd)
    i += 1
    time.sleep(0.05)
os.dup2(keep, fd)
print(i, flush=True)
