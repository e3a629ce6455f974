# Attacks on the metrics listener, run as an unprivileged user.
#   listen N SECS      hold N listening sockets on 127.0.0.2-9 (a large
#                      /proc/net/tcp), print "ready", sleep
#   flood PORT SECS    connect to PORT and hang up, as fast as possible
#   hold PORT N SECS   hold N connections to PORT open, print "held", sleep
import resource, socket, sys, time

_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
what = sys.argv[1]
if what == "listen":
    n, held = int(sys.argv[2]), []
    for a in range(2, 10):
        for p in range(10000, 30000):
            if len(held) >= n:
                break
            s = socket.socket()
            try:
                s.bind((f"127.0.0.{a}", p))
                s.listen(1)
                held.append(s)
            except OSError:
                s.close()
    print("ready", flush=True)
    time.sleep(float(sys.argv[3]))
elif what == "flood":
    port, end = int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            pass
elif what == "hold":
    port, n = int(sys.argv[2]), int(sys.argv[3])
    held = []
    for _ in range(n):
        try:
            held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        except OSError:
            pass
    print("held", flush=True)
    time.sleep(float(sys.argv[4]))
