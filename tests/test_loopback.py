"""The local TF servers are reachable on loopback only (tag_core.runtime.loopback).

TensorFlow binds its gRPC servers to 0.0.0.0; the local runs put them, and their client, in a network
namespace of their own with only `lo` up. The slow tests watch a real `tag run` and `tag calibrate --local 2`
from outside: every listening socket of their processes, the interfaces of the namespace it lives in, the
machine's own listening sockets (/proc/net/tcp and tcp6 of this namespace), and a connection attempt to
each server port on every address of this machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from network_namespaces import NAMESPACES

from tag_core.capture import resolve_model
from tag_core.cluster import parse_topology
from tag_core.emit import emit, write_emission
from tag_core.runtime import loopback
from tag_core.runtime.local_cluster import ServerStartError, child_env, local_cluster, pinnable_cores

MLP = "mlp[features=12,hidden=16]"
BATCH = 8
LOCAL2 = {"name": "local-2", "inter_gbps": 5.0,
          "machines": [{"name": f"task{k}", "gpu": "cpu", "count": 1, "intra_gbps": 5.0} for k in range(2)]}
TAG = str(Path(sys.executable).with_name("tag"))
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason="no private network namespaces here: "
                                                                "test_where_namespaces_are_denied_a_run_is_refused")
two_cores = pytest.mark.skipif(len(pinnable_cores()) < 2, reason="pinned tasks need a core each")


@pytest.fixture(autouse=True)
def default_policy(monkeypatch):
    monkeypatch.delenv(loopback.POLICY_ENV, raising=False)
    monkeypatch.delenv(loopback.JOIN_ENV, raising=False)
    monkeypatch.setattr(loopback, "_warned", False)


# ---------------------------------------------------------------- reading /proc


def _address(hex_address: str) -> str:
    """An address of /proc/net/tcp{,6} as text ("0.0.0.0", "::", "::ffff:127.0.0.1", ...)."""
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))  # four host-order 32-bit words
    return socket.inet_ntop(socket.AF_INET6, words)


def _is_loopback(address: str) -> bool:
    return address.startswith("127.") or address == "::1" or address.startswith("::ffff:127.")


def _listening(proc: str = "/proc/self") -> list[dict]:
    """The listening TCP sockets of the network namespace of `proc`: address, port and socket inode."""
    found = []
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"{proc}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == LISTEN:
                address, port = fields[1].rsplit(":", 1)
                found.append({"address": _address(address), "port": int(port, 16), "inode": int(fields[9])})
    return found


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass
    return inodes


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _interfaces(pid: int) -> list[str]:
    lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
    return [line.split(":")[0].strip() for line in lines if ":" in line]


def _machine_addresses() -> list[str]:
    """The addresses of this machine's own network namespace that are not loopback (IPv4, from fib_trie)."""
    addresses, last = set(), None
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        text = line.strip()
        if text.startswith(("|--", "+--")):
            last = text.split()[1]
        elif "/32 host LOCAL" in text and last and not last.startswith("127."):
            addresses.add(last)
    return sorted(addresses)


def _watch(command: list[str], env: dict, timeout: float) -> tuple[subprocess.CompletedProcess, dict]:
    """Run `command`, sampling its processes' listening sockets every 0.2 s from outside while it runs."""
    host_netns = os.readlink("/proc/self/ns/net")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen: dict = {"listeners": {}, "host_exposed": [], "reached": [], "host_netns": host_netns}
    addresses = ["127.0.0.1", *_machine_addresses()]
    deadline = time.monotonic() + timeout
    try:
        while process.poll() is None and time.monotonic() < deadline:
            for pid in _descendants(process.pid):
                inodes = _socket_inodes(pid)
                try:
                    netns = os.readlink(f"/proc/{pid}/ns/net")
                    own = [s for s in _listening(f"/proc/{pid}") if s["inode"] in inodes]
                    interfaces = _interfaces(pid) if own else []
                except OSError:
                    continue  # it ended meanwhile
                for s in own:
                    seen["listeners"][(pid, s["port"], s["address"])] = {"netns": netns, "interfaces": interfaces}
            ports = {port for _, port, _ in seen["listeners"]}
            seen["host_exposed"] += [s for s in _listening() if s["port"] in ports and not _is_loopback(s["address"])]
            for port in ports:  # from this machine's own namespace, on every address it has
                for address in addresses:
                    try:
                        socket.create_connection((address, port), timeout=0.5).close()
                        seen["reached"].append((address, port))
                    except OSError:
                        pass
            time.sleep(0.2)
    finally:
        if process.poll() is None:
            process.kill()
        out, err = process.communicate()
    return subprocess.CompletedProcess(command, process.returncode, out, err), seen


def _assert_loopback_only(seen: dict, servers: int) -> None:
    listeners = seen["listeners"]
    ports = {port for _, port, _ in listeners}
    assert len(ports) >= servers, f"saw {len(ports)} listening ports of the run's processes, expected {servers}"
    for (pid, port, address), where in listeners.items():
        if _is_loopback(address):
            continue
        assert where["netns"] != seen["host_netns"], f"process {pid} listens on {address}:{port} of this machine"
        assert where["interfaces"] == ["lo"], \
            f"process {pid} listens on {address}:{port} in a namespace with interfaces {where['interfaces']}"
    assert not seen["host_exposed"], f"listeners of this machine on the servers' ports: {seen['host_exposed']}"
    assert not seen["reached"], f"reached the servers from outside their namespace at {seen['reached']}"


# ---------------------------------------------------------------- the namespace itself (fast)


JOINED = ("import os, socket, sys, tag_core.runtime\n"  # joins at import, as every TF child of the package does
          "s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(1)\n"
          "socket.create_connection(('127.0.0.1', s.getsockname()[1])).close()\n"
          "print(os.readlink('/proc/self/ns/net'), s.getsockname()[1], flush=True)\n"
          "sys.stdin.read()\n")


@needs_namespaces
def test_a_child_joins_the_namespace_and_its_wildcard_listener_stays_inside():
    with loopback.loopback_namespace() as held:
        assert held is not None and held.interfaces == ("lo",)
        env = child_env(threads=1)
        assert env[loopback.JOIN_ENV] == held.join_spec
        child = subprocess.Popen([sys.executable, "-c", JOINED], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env)
        try:
            netns, port = child.stdout.readline().split()
            assert netns == f"net:[{held.net_inode}]" != os.readlink("/proc/self/ns/net"), child.stderr.read()
            assert _interfaces(child.pid) == ["lo"]
            listeners = [s for s in _listening(f"/proc/{child.pid}") if s["port"] == int(port)]
            assert listeners and not _is_loopback(listeners[0]["address"])  # 0.0.0.0, of its namespace
            assert not [s for s in _listening() if s["port"] == int(port)]  # not one of this machine's
            for address in ["127.0.0.1", *_machine_addresses()]:
                with pytest.raises(OSError):
                    socket.create_connection((address, int(port)), timeout=1).close()
        finally:
            child.stdin.close()
            child.wait(timeout=30)
    assert loopback.active() is None and loopback.JOIN_ENV not in child_env(threads=1)


@needs_namespaces
def test_open_contexts_share_one_namespace_until_the_last_leaves():
    with loopback.loopback_namespace() as outer:
        with loopback.loopback_namespace() as inner:
            assert inner == outer
        assert loopback.active() == outer and Path(f"/proc/{outer.pid}").exists()
    assert loopback.active() is None and not Path(f"/proc/{outer.pid}").exists()  # the holder was reaped


def test_a_child_that_cannot_join_ends_rather_than_serve_outside():
    env = {**os.environ, loopback.JOIN_ENV: f"{2**22 + 7}:1:2"}  # no such process
    done = subprocess.run([sys.executable, "-c", "import tag_core.runtime; print('served')"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == loopback.JOIN_FAILED_EXIT and "served" not in done.stdout
    assert done.stderr.startswith("tag: error: could not join the loopback-only network namespace"), done.stderr


def test_without_namespaces_the_servers_are_refused_unless_told(monkeypatch, capsys):
    def unavailable():
        raise loopback.NamespaceUnavailable(1, "unshare(CLONE_NEWUSER|CLONE_NEWNET): Operation not permitted")

    monkeypatch.setattr(loopback, "_start_holder", unavailable)
    with pytest.raises(ServerStartError, match="refusing to start TF servers that would listen on every interface"
                                               ".*Operation not permitted.*TAG_NETNS=off"):
        with local_cluster(1):
            pass
    monkeypatch.setenv(loopback.POLICY_ENV, "prefer")
    for _ in range(2):
        with loopback.loopback_namespace() as held:
            assert held is None and loopback.JOIN_ENV not in child_env(threads=1)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("tag: warning: the local TF servers listen on every interface")
    assert "Operation not permitted" in err[0]
    monkeypatch.setenv(loopback.POLICY_ENV, "sometimes")
    with pytest.raises(ServerStartError, match="TAG_NETNS must be one of require, prefer, off"):
        with local_cluster(1):
            pass


def test_off_uses_no_namespace_and_says_so(monkeypatch, capsys):
    monkeypatch.setenv(loopback.POLICY_ENV, "off")
    monkeypatch.setattr(loopback, "_start_holder", lambda: pytest.fail("TAG_NETNS=off started a namespace"))
    with loopback.loopback_namespace() as held:
        assert held is None
    assert "(TAG_NETNS=off)" in capsys.readouterr().err


# ---------------------------------------------------------------- real runs, watched from outside


@pytest.fixture
def emitted(tmp_path):
    emission = emit(resolve_model(MLP, BATCH), parse_topology(LOCAL2), "allreduce", "cpu")
    return write_emission(emission, tmp_path / "emitted")


@needs_namespaces
@two_cores
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_tag_run_servers_listen_on_loopback_only(emitted):
    done, seen = _watch([TAG, "run", str(emitted), "--steps", "150", "--servers", "pinned"], dict(os.environ), 300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reachable on loopback only" in done.stdout.splitlines()[0]
    assert "ran 150 steps" in done.stdout
    _assert_loopback_only(seen, servers=2)


@needs_namespaces
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_tag_run_shared_servers_listen_on_loopback_only(emitted):
    done, seen = _watch([TAG, "run", str(emitted), "--steps", "150", "--servers", "shared", "--json"],
                        dict(os.environ), 300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["ok"]
    _assert_loopback_only(seen, servers=2)


@needs_namespaces
@two_cores
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_tag_calibrate_servers_listen_on_loopback_only(tmp_path):
    out = tmp_path / "local.json"
    done, seen = _watch([TAG, "calibrate", "--local", "2", "--sizes", "4K,64K", "--repeats", "2", "--out", str(out),
                         "--quiet"], dict(os.environ), 300)
    # Every series was measured either way; two sizes and two repeats on a loaded machine may leave a slope
    # that the fit refuses, which says nothing about the servers.
    refused = done.returncode == 1 and "no bandwidth to fit" in done.stderr
    assert done.returncode == 0 or refused, done.stdout + done.stderr
    assert refused or json.loads(out.read_text())["machines"][1]["name"] == "task1"
    _assert_loopback_only(seen, servers=2)


@pytest.mark.skipif(NAMESPACES, reason="namespaces work here: the runs above are watched in one")
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_where_namespaces_are_denied_a_run_is_refused(emitted):
    done = subprocess.run([TAG, "run", str(emitted), "--steps", "1"], env={**os.environ, loopback.POLICY_ENV: "require"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "refusing to start TF servers that would listen on every interface" in done.stdout + done.stderr
    assert "ran 1 steps" not in done.stdout


def test_the_dagster_webserver_binds_loopback(tmp_path, monkeypatch):
    from tag_pipelines import devserver

    started = {}

    class Recorded:
        def __init__(self, command, **kwargs):
            started["command"] = command

    monkeypatch.setattr(devserver.subprocess, "Popen", Recorded)
    devserver.start_dagster_dev({}, tmp_path / "dagster.log", port=3999)
    command = started["command"]
    assert command[command.index("-h") + 1] == "127.0.0.1" and command[command.index("-p") + 1] == "3999"
