"""Loopback-only local TF servers: a private network namespace in which only `lo` is up.

TensorFlow's gRPC server listens on every interface: grpc_server_lib.cc binds "0.0.0.0:<port>" whatever
the cluster spec says, and nothing in its API changes that. A TF server runs any graph sent to it (file
reads and writes included) without authentication, so a local server in the machine's own network
namespace lets anyone who can reach the machine run code as its user while a run lasts.

So the local runs (`tag run`, `tag calibrate --local`, `tag fidelity`) put their servers and the
client that talks to them into a network namespace of their own, in which the only interface is `lo`:
"0.0.0.0" there is loopback of that namespace, which nothing outside it can reach. The parent (the
`tag` command) stays outside and talks to its children over pipes only.

How: `loopback_namespace()` starts a small holder process (this file, run by path with only the
standard library) that calls unshare(CLONE_NEWUSER | CLONE_NEWNET) (a user namespace, so that no
privilege is needed; the user keeps its own uid and gid inside), brings `lo` up with an SIOCSIFFLAGS
ioctl and waits until its stdin closes. While the context is open, `child_environment()` names that
namespace (TAG_NETNS_JOIN="pid:user-inode:net-inode"); every TF child of the package is started as
`python -m tag_core.runtime.<module>` with it, and `join_from_environment()`, which runs when the
package is imported (tag_core.runtime.supervisor, the first thing the package imports), setns()es
into the holder's user and network namespaces before anything in the process starts a thread (a
multi-threaded process cannot join a user namespace). A child that was told to join and cannot exits
at once rather than serve on every interface.

Where namespaces are not available (a container whose seccomp profile forbids unshare, a kernel or
AppArmor policy that denies unprivileged user namespaces), TAG_NETNS decides:

- "require" (the default): refuse to start the servers (`NamespaceRefused`, one line saying why);
- "prefer": use a namespace when one can be made, else warn once and serve on every interface;
- "off": never use one; warn once that the servers listen on every interface.

A real cluster (`--cluster`) cannot use a namespace: its tasks must reach each other between machines.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

POLICY_ENV = "TAG_NETNS"
POLICIES = ("require", "prefer", "off")
JOIN_ENV = "TAG_NETNS_JOIN"
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
IFREQ = "16sh22x"  # struct ifreq: the name, then ifr_flags in a 24-byte union
HOLDER_START_S = 30.0  # a Python start-up on a loaded machine
JOIN_FAILED_EXIT = 3


class NamespaceUnavailable(OSError):
    """This machine cannot make a private network namespace for this user (why, in one line)."""


class NamespaceRefused(RuntimeError):
    """TAG_NETNS=require and no namespace could be made: the servers are not started."""


@dataclass(frozen=True)
class Namespace:
    """A held namespace: the holder's process id and the inodes of its user and network namespaces."""

    pid: int
    user_inode: int
    net_inode: int
    interfaces: tuple[str, ...]

    @property
    def join_spec(self) -> str:
        return f"{self.pid}:{self.user_inode}:{self.net_inode}"


_lock = threading.Lock()
_active: Namespace | None = None
_holder: subprocess.Popen | None = None
_users = 0  # open loopback_namespace() contexts sharing _active
_warned = False


def policy() -> str:
    value = os.environ.get(POLICY_ENV, "require").strip().lower() or "require"
    if value not in POLICIES:
        raise NamespaceRefused(f"{POLICY_ENV} must be one of {', '.join(POLICIES)}, got {value!r}")
    return value


def active() -> Namespace | None:
    """The namespace the local servers of this process are started in now (None: the host's network)."""
    return _active


def child_environment() -> dict[str, str]:
    """What the environment of a TF child must carry to join the active namespace ({} when none is)."""
    held = _active
    return {JOIN_ENV: held.join_spec} if held is not None else {}


@contextmanager
def loopback_namespace() -> Iterator[Namespace | None]:
    """A private network namespace with only `lo` up, held while the context is open (the one already open,
    in this or another thread, is shared: it ends when the last user leaves); None when TAG_NETNS lets the
    servers run on the host's network (a warning says so)."""
    global _active, _holder, _users
    with _lock:
        if _active is not None:
            _users += 1
            held = _active
        else:
            held = _open()
    if held is None:
        yield None
        return
    try:
        yield held
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                holder, _active, _holder = _holder, None, None
                _stop_holder(holder)


def _open() -> Namespace | None:
    """Start holding a namespace (under _lock), or None where TAG_NETNS allows going without one."""
    global _active, _holder, _users
    chosen = policy()
    if chosen == "off":
        _warn(f"{POLICY_ENV}=off")
        return None
    try:
        _holder, _active = _start_holder()
    except NamespaceUnavailable as exc:
        why = exc.strerror or str(exc)
        if chosen == "require":
            raise NamespaceRefused(
                f"refusing to start TF servers that would listen on every interface of this machine, "
                f"unauthenticated (TensorFlow binds 0.0.0.0): a private network namespace is not available here "
                f"({why}); set {POLICY_ENV}=off to run them exposed anyway") from None
        _warn(f"no private network namespace here: {why}")
        return None
    _users = 1
    return _active


def _warn(why: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        print(f"tag: warning: the local TF servers listen on every interface of this machine, unauthenticated, "
              f"while they run: anyone who reaches a port can run code as this user ({why})", file=sys.stderr,
              flush=True)


def _start_holder() -> tuple[subprocess.Popen, Namespace]:
    # -I: no user site, no PYTHON* variables, and not this folder first on sys.path (it would shadow modules).
    holder = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "hold"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    line = b""
    deadline = time.monotonic() + HOLDER_START_S
    while not line.endswith(b"\n"):
        wait = deadline - time.monotonic()
        if wait <= 0 or not select.select([holder.stdout], [], [], wait)[0]:
            _stop_holder(holder)
            raise NamespaceUnavailable(errno.ETIMEDOUT, f"the namespace holder did not answer in {HOLDER_START_S:g} s")
        chunk = os.read(holder.stdout.fileno(), 4096)
        if not chunk:
            break
        line += chunk
    try:
        answer = json.loads(line.decode())
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or "error" in answer:
        _stop_holder(holder, keep_stderr=True)
        detail = holder.stderr.read().decode(errors="replace").strip().splitlines()
        holder.stderr.close()
        why = answer["error"] if isinstance(answer, dict) else (detail[-1][-300:] if detail else
                                                                "the namespace holder ended without answering")
        raise NamespaceUnavailable(errno.EPERM, why)
    return holder, Namespace(holder.pid, answer["user"], answer["net"], tuple(answer["interfaces"]))


def _stop_holder(holder: subprocess.Popen, keep_stderr: bool = False) -> None:
    try:
        holder.stdin.close()  # it waits for this
    except OSError:
        pass
    try:
        holder.wait(timeout=5)
    except subprocess.TimeoutExpired:
        holder.kill()
        holder.wait()
    holder.stdout.close()
    if not keep_stderr:
        holder.stderr.close()


# ---------------------------------------------------------------- inside the children


def join_from_environment() -> None:
    """Join the namespace TAG_NETNS_JOIN names, if any (see the module docstring); a process that was told to
    join and cannot ends here, with one line on stderr, rather than serve on every interface."""
    spec = os.environ.get(JOIN_ENV)
    if not spec:
        return
    try:
        join(spec)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"tag: error: could not join the loopback-only network namespace of the local run "
                         f"({exc}); not serving on every interface instead\n")
        sys.stderr.flush()
        os._exit(JOIN_FAILED_EXIT)


def join(spec: str) -> None:
    """setns() into the user and network namespaces of the holder `spec` ("pid:user-inode:net-inode") names;
    nothing when this process is in that network namespace already (a child of one that joined)."""
    pid, user_inode, net_inode = (int(part) for part in spec.split(":"))
    if os.stat("/proc/self/ns/net").st_ino == net_inode:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    fds = [os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC) for kind in ("user", "net")]
    try:
        for fd, inode, kind in zip(fds, (user_inode, net_inode), (CLONE_NEWUSER, CLONE_NEWNET)):
            if os.fstat(fd).st_ino != inode:  # the holder is gone and its process id was reused
                raise OSError(errno.ESRCH, f"process {pid} no longer holds the namespace")
            if libc.setns(fd, kind) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"setns({'user' if kind == CLONE_NEWUSER else 'net'}): {os.strerror(code)}")
    finally:
        for fd in fds:
            os.close(fd)
    if os.stat("/proc/self/ns/net").st_ino != net_inode:
        raise OSError(errno.EINVAL, "still in another network namespace after setns")


# ---------------------------------------------------------------- the holder process


def interfaces() -> list[str]:
    """The network interfaces of this process's namespace."""
    with open("/proc/self/net/dev") as dev:
        return [line.split(":")[0].strip() for line in dev.readlines()[2:] if ":" in line]


def bring_lo_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        flags = struct.unpack(IFREQ, fcntl.ioctl(probe.fileno(), SIOCGIFFLAGS, struct.pack(IFREQ, b"lo", 0)))[1]
        fcntl.ioctl(probe.fileno(), SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP))


def make_namespace() -> None:
    """unshare() this (single-threaded) process into a new user and network namespace, keep the user's uid
    and gid, and bring `lo` up; OSError naming the step that failed."""
    uid, gid = os.getuid(), os.getgid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"unshare(CLONE_NEWUSER|CLONE_NEWNET): {os.strerror(code)}")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        try:
            with open(f"/proc/self/{name}", "w") as handle:
                handle.write(text)
        except OSError as exc:
            raise OSError(exc.errno, f"writing /proc/self/{name}: {exc.strerror}") from None
    try:
        bring_lo_up()
    except OSError as exc:
        raise OSError(exc.errno, f"bringing lo up: {exc.strerror}") from None
    if interfaces() != ["lo"]:
        raise OSError(errno.EEXIST, f"the new namespace has interfaces {interfaces()}, not only lo")
    probe = socket.socket()
    try:  # loopback answers: the servers will reach each other
        probe.bind(("127.0.0.1", 0))
        probe.listen(1)
        socket.create_connection(probe.getsockname(), timeout=5).close()
    except OSError as exc:
        raise OSError(exc.errno, f"loopback does not answer in the new namespace: {exc.strerror}") from None
    finally:
        probe.close()


def hold() -> int:
    """Make the namespace, say so on stdout as one JSON line, and hold it until stdin closes."""
    try:
        make_namespace()
    except OSError as exc:
        print(json.dumps({"error": exc.strerror or str(exc)}), flush=True)
        return 1
    print(json.dumps({"user": os.stat("/proc/self/ns/user").st_ino, "net": os.stat("/proc/self/ns/net").st_ino,
                      "interfaces": interfaces()}), flush=True)
    while sys.stdin.buffer.read(4096):  # the parent closes it, or dies
        pass
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["hold"]:
        sys.exit("usage: python -I loopback.py hold")
    sys.exit(hold())
