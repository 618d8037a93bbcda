# plimsoll-agent's session driver for Python (docs/agent.md, "Sessions"), run as
# `python3 -I -B -c DRIVER` with the agent's pipes at descriptors 3 (cells in) and 4 (one
# byte out per event: R ready, 0 a cell completed, 1 it raised). Every cell runs in one
# module, `__main__`, so its names stay for the next. Everything of the driver itself
# lives in this function's frame, out of the cells' sight.
def _plimsoll_session():
    import linecache
    import os
    import sys

    cells, done = 3, 4
    # The memory limit's OOM killer picks the cells' interpreter (and what it starts) before
    # the agent that holds the session: raising one's own score needs no privilege.
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    # Placed by the agent without close-on-exec; a process a cell starts gets neither.
    os.set_inheritable(cells, False)
    os.set_inheritable(done, False)
    main = type(sys)("__main__")
    main.__builtins__ = __builtins__
    main.__annotations__ = {}
    sys.modules["__main__"] = main
    sys.argv[:] = [""]
    scope = main.__dict__
    # Output as it is printed, a line at a time, as on a terminal: a streamed cell shows
    # each line when it comes, not when the cell ends.
    # A session with a grant: its client's directory on the path, as a snippet's boot puts
    # it there (-I ignores PYTHONPATH, which names it).
    if os.environ.get("PLIMSOLL_BROKER_SOCKET"):
        for d in os.environ.get("PYTHONPATH", "").split(os.pathsep):
            if d and d not in sys.path:
                sys.path.append(d)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)
        except Exception:
            pass

    def read(n):
        parts = []
        while n:
            got = os.read(cells, min(n, 1 << 20))
            if not got:
                # The agent went away: nothing more will come.
                os._exit(0)
            parts.append(got)
            n -= len(got)
        return b"".join(parts)

    def header():
        line = b""
        while not line.endswith(b"\n"):
            line += read(1)
        return int(line)

    def flush():
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except Exception:
                pass

    os.write(done, b"R")
    count = 0
    while True:
        source = read(header()).decode("utf-8", "surrogateescape")
        count += 1
        name = "<cell %d>" % count
        # Tracebacks show the cell's own lines, as they show a file's.
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        ok = True
        try:
            exec(compile(source, name, "exec", dont_inherit=True), scope)
        except SystemExit:
            # Exits the interpreter, as in `python3 FILE`: the session's state ends.
            flush()
            raise
        except BaseException:
            ok = False
            kind, value, tb = sys.exc_info()
            # This function's frame left out: the traceback starts in the cell.
            tb = tb.tb_next
            value = value.with_traceback(tb)
            # As the interactive interpreter does, for `pdb.pm()` in the next cell.
            sys.last_type, sys.last_value, sys.last_traceback = kind, value, tb
            try:
                if sys.excepthook is sys.__excepthook__:
                    # The traceback module reads the cell's lines from linecache, which
                    # the interpreter's own hook does not.
                    import traceback

                    traceback.print_exception(kind, value, tb)
                else:
                    sys.excepthook(kind, value, tb)
            except BaseException:
                pass
            del kind, value, tb
        flush()
        os.write(done, b"0" if ok else b"1")


_plimsoll_session()
