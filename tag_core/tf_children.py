"""TF child processes started as forks of a process that has already imported TensorFlow.

Every TF child of TAG (servers, run and measuring clients, profiles, captures, trainers) used to pay
`import tensorflow` itself: 3 to 5 s of CPU, most of a short child's life. `popen` and `run` take a
`python -m module ...` command and run it in a fork of a preloaded process (a zygote, tag_core.tf_zygote),
one per interpreter and environment; anything else, or TAG_FORK_CHILDREN=0, starts a plain process. The
fork runs its module as `python -m` would: its own stdio, environment, working folder, CPU affinity and
session. Its parent is the zygote, which ends when the process that started it closes it or dies, so
`parent_watch` still ends the fork then.

Forking after `import tensorflow` is safe because importing starts no TF runtime: no session, server,
device or thread pool exists until the fork creates them.
"""

from __future__ import annotations

import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from tag_core import tf_zygote

DISABLE_ENV = "TAG_FORK_CHILDREN"
# What the interpreter, the dynamic loader, TF, Keras and numpy read while TF is imported: a fork runs with
# its own environment, but these must match its zygote's, so they pick the zygote. The rest (TAG's, Dagster's
# and pytest's own variables) is read later, in the fork.
IMPORT_PREFIXES = ("TF_", "PYTHON", "LD_", "GLIBC_", "MALLOC_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOTO",
                   "XLA_", "CUDA", "NVIDIA", "KERAS", "NPY_", "GRPC_", "LC_")
IMPORT_NAMES = frozenset({"HOME", "TMPDIR", "TEMP", "TMP", "PATH", "LANG"})
# Late too: TF reads the thread counts when a session builds its pools (OpenBLAS reads OMP_NUM_THREADS when
# numpy loads, but no TF kernel runs on it); a fork sets up its stdio from PYTHONUNBUFFERED itself; and the
# zygote always imports Keras, which children told TF_USE_LEGACY_KERAS (to skip it) never touch. So one
# zygote serves captures, servers, clients and profiles alike.
LATE_NAMES = frozenset({"TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS", "PYTHONUNBUFFERED",
                        "TF_USE_LEGACY_KERAS"})
MAX_ZYGOTES = 2  # each holds an imported TF (~0.6 GB, shared with its forks until they write)
IDLE_S = 30.0  # a zygote with no live fork for this long is closed: it holds an imported TF
READY_S = 180.0


def popen(command: list[str], *, stdin=None, stdout=None, stderr=None, text: bool = False,
          env: dict[str, str] | None = None, start_new_session: bool = False, cwd: str | None = None):
    """subprocess.Popen(command, ...) for a TF child: a fork of a preloaded zygote where `command` is
    `[sys.executable, "-m", module, ...]`, else (or when no zygote can start) a plain process."""
    env = dict(os.environ if env is None else env)
    if _forkable(command, env):
        zygote = _zygote_for(env)
        if zygote is not None:
            child = zygote.spawn(command, stdin, stdout, stderr, text, env, start_new_session, cwd)
            if child is not None:
                return child
    return subprocess.Popen(command, stdin=stdin, stdout=stdout, stderr=stderr, text=text, env=env,
                            start_new_session=start_new_session, cwd=cwd)


def run(command: list[str], *, env: dict[str, str] | None = None, timeout: float | None = None,
        cwd: str | None = None) -> subprocess.CompletedProcess:
    """subprocess.run(command, capture_output=True, text=True, ...) through `popen`; on timeout the child
    is killed and subprocess.TimeoutExpired raised, as run does."""
    child = popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                  text=True, env=env, cwd=cwd)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise
    return subprocess.CompletedProcess(command, child.returncode, out, err)


def _forkable(command: list[str], env: dict[str, str]) -> bool:
    return (env.get(DISABLE_ENV, "1") != "0" and len(command) >= 3 and command[0] == sys.executable
            and command[1] == "-m")


def _key(env: dict[str, str]) -> tuple:
    return tuple(sorted((name, value) for name, value in env.items()
                        if (name.startswith(IMPORT_PREFIXES) or name in IMPORT_NAMES) and name not in LATE_NAMES))


_zygotes: OrderedDict[tuple, _Zygote | None] = OrderedDict()
_zygotes_lock = threading.Lock()


def _zygote_for(env: dict[str, str]) -> _Zygote | None:
    """The live zygote for this environment, started when there is none; None where none can start (then
    not tried again) or every zygote is busy."""
    key = _key(env)
    with _zygotes_lock:
        if key in _zygotes:
            zygote = _zygotes[key]
            if zygote is None or zygote.alive():
                _zygotes.move_to_end(key)
                return zygote
            del _zygotes[key]
        while len(_zygotes) >= MAX_ZYGOTES:
            idle = next((k for k, z in _zygotes.items() if z is None or not z.children), None)
            if idle is None:
                return None
            old = _zygotes.pop(idle)
            if old is not None:
                old.close()
        zygote = _zygotes[key] = _Zygote.start(env)
        return zygote


@dataclass(eq=False)
class ForkedChild:
    """The part of subprocess.Popen that TAG uses, for a fork of a zygote (which reaps it and reports its exit)."""

    args: list[str]
    pid: int
    stdin: io.IOBase | None = None
    stdout: io.IOBase | None = None
    stderr: io.IOBase | None = None
    returncode: int | None = None
    _exited: threading.Event = field(default_factory=threading.Event, repr=False)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, input: str | bytes | None = None, timeout: float | None = None):
        """Write `input`, read stdout and stderr to their ends, wait; as Popen.communicate."""
        results: dict[str, str | bytes] = {}
        readers = [threading.Thread(target=lambda name=name, pipe=pipe: results.__setitem__(name, pipe.read()),
                                    daemon=True)
                   for name, pipe in (("out", self.stdout), ("err", self.stderr)) if pipe is not None]
        for reader in readers:
            reader.start()
        if self.stdin is not None:
            try:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
            except BrokenPipeError:
                pass
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return results.get("out"), results.get("err")

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()


class _Zygote:
    """The caller's end of one zygote: requests go out on a socket, started pids and exit codes come back."""

    def __init__(self, process: subprocess.Popen, sock: socket.socket):
        self.process, self.sock = process, sock
        self.children: dict[int, ForkedChild] = {}
        self.lock = threading.Lock()  # one request at a time
        self.replies: list[dict] = []
        self.replied = threading.Condition()
        self.last_used = time.monotonic()
        self.closed = False
        threading.Thread(target=self._read, daemon=True, name="tag-zygote-reader").start()

    @classmethod
    def start(cls, env: dict[str, str]) -> _Zygote | None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = subprocess.Popen([sys.executable, "-m", tf_zygote.__name__, str(theirs.fileno())],
                                       pass_fds=[theirs.fileno()], env=_zygote_env(env), stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            ours.close()
            return None
        finally:
            theirs.close()
        ours.settimeout(READY_S)
        try:
            ready = json.loads(ours.recv(tf_zygote.MESSAGE_BYTES) or b"{}")
        except (OSError, ValueError):
            ready = {}
        if not ready.get("ready"):
            process.kill()
            process.wait()
            ours.close()
            return None
        ours.settimeout(None)
        return cls(process, ours)

    def alive(self) -> bool:
        return not self.closed and self.process.poll() is None

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def spawn(self, command, stdin, stdout, stderr, text, env, new_session, cwd) -> ForkedChild | None:
        ends, ours, close_after = _child_ends(stdin, stdout, stderr)
        request = {"module": command[2], "argv": command[3:], "env": env, "cwd": os.path.abspath(cwd or "."),
                   "new_session": new_session, "affinity": sorted(os.sched_getaffinity(0))}
        try:
            with self.lock:
                if not self.alive():
                    return None
                socket.send_fds(self.sock, [json.dumps(request).encode()], ends)
                reply = self._reply()
        except OSError:
            reply = None
        finally:
            for fd in close_after:
                os.close(fd)
        if reply is None or "started" not in reply:
            for fd in ours.values():
                os.close(fd)
            return None
        child = reply["child"]
        child.args = list(command)
        for name, fd in ours.items():
            mode = ("w" if name == "stdin" else "r") + ("" if text else "b")
            setattr(child, name, os.fdopen(fd, mode))
        self.last_used = time.monotonic()
        return child

    def _reply(self) -> dict | None:
        with self.replied:
            while not self.replies and self.alive():
                self.replied.wait(1.0)
            return self.replies.pop(0) if self.replies else None

    def _read(self) -> None:
        while True:
            readable, _, _ = select.select([self.sock], [], [], 1.0)
            if not readable:
                if not self.children and time.monotonic() - self.last_used > IDLE_S and self.lock.acquire(False):
                    try:
                        self.closed = True  # idle: the zygote ends on end of file
                        self.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    finally:
                        self.lock.release()
                continue
            try:
                data = self.sock.recv(tf_zygote.MESSAGE_BYTES)
            except OSError:
                data = b""
            if not data:
                break
            message = json.loads(data)
            if "started" in message:  # registered here, before its exit can arrive; the reply carries it
                message["child"] = self.children[message["started"]] = ForkedChild(args=[], pid=message["started"])
            if "exited" in message:
                child = self.children.pop(message["exited"], None)
                if child is not None:
                    child._exit(message["code"])
                self.last_used = time.monotonic()
                continue
            with self.replied:
                self.replies.append(message)
                self.replied.notify_all()
        self.closed = True
        for pid, child in list(self.children.items()):  # the zygote is gone: it can no longer report these
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child._exit(-signal.SIGKILL)
        self.children.clear()
        with self.replied:
            self.replied.notify_all()
        self.process.wait()


def _zygote_env(env: dict[str, str]) -> dict[str, str]:
    """The zygote's own environment: without the late variables, so that what it loaded does not depend on
    which child asked first."""
    return {name: value for name, value in env.items() if name not in LATE_NAMES}


def _child_ends(stdin, stdout, stderr) -> tuple[list[int], dict[str, int], list[int]]:
    """The fds the fork gets as 0, 1 and 2; the caller's ends of its pipes; the fds to close once sent."""
    ends: list[int] = []
    ours: dict[str, int] = {}
    close_after: list[int] = []
    for number, (name, spec) in enumerate((("stdin", stdin), ("stdout", stdout), ("stderr", stderr))):
        if spec == subprocess.PIPE:
            read, write = os.pipe()
            theirs, ours[name] = (read, write) if number == 0 else (write, read)
            close_after.append(theirs)
        elif spec == subprocess.DEVNULL:
            theirs = os.open(os.devnull, os.O_RDWR)
            close_after.append(theirs)
        elif spec == subprocess.STDOUT and number == 2:
            theirs = ends[1]
        elif spec is None:
            theirs = number
        else:
            theirs = spec if isinstance(spec, int) else spec.fileno()
        ends.append(theirs)
    return ends, ours, close_after
