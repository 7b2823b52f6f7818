"""The zygote of tag_core.tf_children: a process that imports TensorFlow once, then forks a child per request
and runs the requested module in it as `python -m` would; each child's exit goes back to the caller.

Run as `python -m tag_core.tf_zygote FD`, FD being its end of a SOCK_SEQPACKET socket pair: requests come
in as JSON with the child's three stdio fds; "ready", "started" and "exited" messages go out. It ends at
end of file, that is when its caller closes the socket or dies.
"""

from __future__ import annotations

import io
import json
import os
import select
import signal
import socket
import sys
import threading

PRELOAD = "tensorflow"
MESSAGE_BYTES = 1 << 20  # the largest message either side reads
# A fork starts with no signal blocked and these at their defaults, whatever the process that started the
# zygote had blocked or ignored.
DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM,
                   signal.SIGCHLD)


def _serve(sock: socket.socket) -> None:
    """Import TF, say ready, then fork a child per request and report each exit, until end of file."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # an inherited SIG_IGN would reap the forks unseen
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the forks in the caller's group, not this
    try:
        __import__(PRELOAD)
    except BaseException as exc:  # noqa: BLE001 - the caller falls back to plain processes
        sock.send(json.dumps({"ready": False, "error": repr(exc)}).encode())
        return
    sock.send(json.dumps({"ready": True}).encode())
    children: set[int] = set()
    while True:
        readable, _, _ = select.select([sock], [], [], 0.05)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            sock.send(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
        if not readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 3)
        except OSError:
            data, fds = b"", []
        if not data:
            return
        request = json.loads(data)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            sock.close()
            _be_child(request, fds)  # never returns
        for fd in fds:
            os.close(fd)
        children.add(pid)
        sock.send(json.dumps({"started": pid}).encode())


def _be_child(request: dict, fds: list[int]) -> None:
    code = 1
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        for number in DEFAULT_SIGNALS:
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _retitle([sys.executable, "-m", request["module"], *request["argv"]])  # before environ moves
        if request["new_session"]:
            os.setsid()
        for number, fd in enumerate(fds):
            os.dup2(fd, number)
        for fd in set(fds) - {0, 1, 2}:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.sched_setaffinity(0, request["affinity"])
        _reopen_stdio()
        sys.argv = [request["module"], *request["argv"]]
        sys.path[0] = os.getcwd()  # as `python -m` sets it
        code = _run_module(request["module"])
    except BaseException:  # noqa: BLE001 - the fork could not become the child
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _run_module(module: str) -> int:
    import atexit
    import runpy
    import traceback

    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - printed as the interpreter would, then exit 1
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()  # wait for non-daemon threads, as interpreter exit does
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - exiting anyway
        pass
    return code


def _retitle(command: list[str]) -> None:
    """Show the fork in ps and /proc/PID/cmdline as the command it runs, not as its zygote."""
    try:
        import setproctitle
    except ImportError:  # only the title is lost
        return
    setproctitle.setproctitle(" ".join(command))


def _reopen_stdio() -> None:
    """New stdio objects on the fds just installed, buffered as a new interpreter would buffer them."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    encoding, errors = sys.stdout.encoding, sys.stdout.errors
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.open(0, "rb", closefd=False), encoding=encoding, errors=errors)
    for number, name in ((1, "stdout"), (2, "stderr")):
        raw = io.open(number, "wb", buffering=0 if unbuffered else -1, closefd=False)
        stream = io.TextIOWrapper(raw, encoding=encoding, errors="backslashreplace" if number == 2 else errors,
                                  line_buffering=number == 2 or (not unbuffered and raw.isatty()),
                                  write_through=unbuffered)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


if __name__ == "__main__":
    _serve(socket.socket(fileno=int(sys.argv[1])))
