import os, signal, stat, sys
MARKER = "@MARKER_REVERSED@"[::-1]
SCENARIO = "@SCENARIO@"
out = []
def attempt(what, f):
    try:
        got = f()
        out.append(f"{what}: read {len(got)} bytes{' MARKER' if MARKER.encode() in got else ''}")
    except OSError as e:
        out.append(f"{what}: errno {e.errno}")
def ppid(pid):
    with open(f"/proc/{pid}/status") as f:
        return int([l.split()[1] for l in f if l.startswith("PPid:")][0])
launcher = os.getppid()
runner = ppid(launcher)
agent = ppid(runner)
attempt("scenario", lambda: open(SCENARIO, "rb").read())
attempt("job", lambda: open("/opt/plimsoll/bin/job.json", "rb").read())
for who, pid in (("runner", runner), ("launcher", launcher), ("agent", agent)):
    attempt(f"{who} mem", lambda pid=pid: open(f"/proc/{pid}/mem", "rb").read(16))
    attempt(f"{who} environ", lambda pid=pid: open(f"/proc/{pid}/environ", "rb").read())
    attempt(f"{who} fd0", lambda pid=pid: open(f"/proc/{pid}/fd/0", "rb").read(1 << 20))
    attempt(f"{who} kill", lambda pid=pid: os.kill(pid, signal.SIGKILL) or b"")
# The contents of the runner's, the launcher's and the agent's descriptors (docs/trials.md:
# the controller sees their numbers, never what they hold): every regular file among them
# that gives a byte is listed.
readable = []
for who, pid in (("runner", runner), ("launcher", launcher), ("agent", agent)):
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        continue
    for n in fds:
        try:
            if not stat.S_ISREG(os.stat(f"/proc/{pid}/fd/{n}").st_mode):
                continue
            fd = os.open(f"/proc/{pid}/fd/{n}", os.O_RDONLY | os.O_NONBLOCK)
            try:
                if os.read(fd, 4096):
                    readable.append(f"{who} fd {n} ({os.readlink(f'/proc/{pid}/fd/{n}')})")
            finally:
                os.close(fd)
        except OSError:
            pass
out.append(f"descriptors read: {readable}")
# Everything readable that might hold the scenario: other processes' files, the tools,
# the work and scratch directories.
found, scanned = [], 0
me = str(os.getpid())
paths = []
for pid in os.listdir("/proc"):
    if pid.isdigit() and pid != me:
        paths += [f"/proc/{pid}/environ", f"/proc/{pid}/cmdline"]
        try:
            paths += [f"/proc/{pid}/fd/{n}" for n in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            pass
for top in ("/opt/plimsoll/bin", "/work", "/tmp", "/dev/shm"):
    for d, _, names in os.walk(top):
        paths += [os.path.join(d, n) for n in names]
for p in paths:
    try:
        # Regular files only (a descriptor's pipe would block or steal the runner's data).
        if not stat.S_ISREG(os.stat(p).st_mode):
            continue
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        try:
            data = os.read(fd, 1 << 20)
        finally:
            os.close(fd)
        scanned += 1
        if MARKER.encode() in data:
            found.append(p)
    except OSError:
        pass
out.append(f"marker found in {found}, {scanned} files read")
out.append(f"ids {os.getresuid()} {os.getresgid()} {os.getgroups()}")
print("\n".join(out), file=sys.stderr, flush=True)
for line in sys.stdin:
    x, x_dot, theta, theta_dot = (float(v) for v in line.split())
    force = 1.0 * x + 2.0 * x_dot + 25.0 * theta + 5.0 * theta_dot
    sys.stdout.write(repr(force) + "\n")
    sys.stdout.flush()
