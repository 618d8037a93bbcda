# The seccomp probe (tests/seccomp/common.rs puts a list of calls in place of CALLS and
# runs this as a snippet inside a real sandbox). Each call is a raw system call through
# ctypes, made in this process ("direct") or in a forked child ("child", for calls that
# would change this process: namespaces, setsid, fork, clone). An argument is an integer
# or "buf" (a zeroed buffer's address). Prints one JSON object:
# label -> [return value, errno] (a child killed by a signal gives errno -signal), plus
# "threads": whether a thread ran (clone through glibc, after clone3's ENOSYS).
import ctypes
import json
import os
import threading

CALLS = json.loads(r"""@CALLS@""")

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


# The argument "buf" is the address of a zeroed 4 KiB buffer of its own.
def arg(a):
    if a == "buf":
        buf = ctypes.create_string_buffer(4096)
        BUFS.append(buf)
        return ctypes.c_long(ctypes.addressof(buf))
    return ctypes.c_long(a)


BUFS = []


def call(nr, args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[arg(a) for a in args])
    return [r, ctypes.get_errno() if r == -1 else 0]


def in_child(nr, args):
    pid = os.fork()
    if pid == 0:
        r, e = call(nr, args)
        # A successful fork or clone returns twice: both copies leave here.
        os._exit(e if r == -1 else 0)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return [-1, -os.WTERMSIG(status)]
    code = os.WEXITSTATUS(status)
    return [0, 0] if code == 0 else [-1, code]


out = {}
for c in CALLS:
    out[c["label"]] = (in_child if c["child"] else call)(c["nr"], c["args"])

ran = []
t = threading.Thread(target=lambda: ran.append(1))
t.start()
t.join()
out["threads"] = [len(ran), 0]
print("SECCOMP-PROBE " + json.dumps(out, sort_keys=True))
