# Counts the opens (inotify IN_OPEN) of the given paths until stdin closes,
# then prints the count.  O_PATH descriptors raise no IN_OPEN: every event
# is a real open, by whoever made it.  Prints "ready" once watching.
import ctypes
import os
import select
import struct
import sys

libc = ctypes.CDLL(None, use_errno=True)
IN_OPEN = 0x20
ino = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
for p in sys.argv[1:]:
    if libc.inotify_add_watch(ino, p.encode(), IN_OPEN) < 0:
        sys.exit(f"inotify_add_watch {p}: errno {ctypes.get_errno()}")
print("ready", flush=True)
opens = 0
while True:
    ready, _, _ = select.select([ino, sys.stdin], [], [])
    if ino in ready:
        data = os.read(ino, 65536)
        off = 0
        while off < len(data):
            _wd, _mask, _cookie, n = struct.unpack_from("iIII", data, off)
            off += 16 + n
            opens += 1
    if sys.stdin in ready and not sys.stdin.read(1):
        break
print(opens, flush=True)
