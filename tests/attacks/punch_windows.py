# Writes a file 1 MiB at a time for argv[2] seconds, punching each MiB out
# (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE) as soon as it is written:
# the writes stay sequential, so they stream, but the windows the agent
# flushes hold no page.  Prints how many MiB it punched.
import ctypes, os, sys, time

libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
MIB = 1 << 20
fd = os.open(sys.argv[1] + '/punched', os.O_WRONLY | os.O_CREAT, 0o644)
buf, pos, end = b'p' * MIB, 0, time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    os.pwrite(fd, buf, pos)
    libc.fallocate(fd, 3, pos, MIB)
    pos += MIB
print(pos // MIB, flush=True)
