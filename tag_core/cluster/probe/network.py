"""A machine's network links: Ethernet speeds from `/sys/class/net/*/speed` and InfiniBand port rates from
`/sys/class/infiniband/*/ports/*/rate` or `ibstat`. Each reader takes the text of the command that shows it
(`grep . /sys/class/net/*/speed` prints `path:value` lines), so a recorded probe replays the same way."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tag_core.errors import TagInputError

NET_SPEED = "grep . /sys/class/net/*/speed"
IB_RATE = "grep . /sys/class/infiniband/*/ports/*/rate"
IBSTAT = "ibstat"
# Interfaces that are not a wire to another machine.
_VIRTUAL = re.compile(r"^(lo|ifb\d*|docker\d*|veth.*|br-.*|virbr\d*|cni\d*|flannel.*|cali.*|tun\d*|tap\d*)$")


@dataclass(frozen=True)
class Nic:
    name: str
    kind: str  # "ethernet" or "infiniband"
    gbps: float | None  # None: the kernel does not know (virtual NICs report -1)


def parse_net_speeds(text: str, tool: str = NET_SPEED) -> list[Nic]:
    nics = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        match = re.fullmatch(r"/sys/class/net/([^/]+)/speed:\s*(-?\d+)\s*", line)
        if not match:
            raise TagInputError(tool, f"line {number}: not `/sys/class/net/<if>/speed:<Mbit/s>`: {line.strip()!r}")
        if _VIRTUAL.match(match[1]):
            continue
        mbps = int(match[2])
        nics.append(Nic(match[1], "ethernet", mbps / 1000 if mbps > 0 else None))
    return nics


def parse_ib_rates(text: str, tool: str = IB_RATE) -> list[Nic]:
    nics = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        match = re.fullmatch(r"/sys/class/infiniband/([^/]+)/ports/(\d+)/rate:\s*([\d.]+) Gb/sec.*", line.strip())
        if not match:
            raise TagInputError(tool, f"line {number}: not `…/ports/<n>/rate:<N> Gb/sec (…)`: {line.strip()!r}")
        nics.append(Nic(f"{match[1]}/{match[2]}", "infiniband", float(match[3])))
    return nics


def parse_ibstat(text: str, tool: str = IBSTAT) -> list[Nic]:
    """`ibstat`: a `CA '<name>'` block per adapter, a `Port <n>:` block per port with `State` and `Rate`."""
    nics, adapter, port, state = [], None, None, None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if match := re.fullmatch(r"CA '([^']+)'", stripped):
            adapter, port = match[1], None
        elif match := re.fullmatch(r"Port (\d+):", stripped):
            if adapter is None:
                raise TagInputError(tool, f"line {number}: a port before any `CA '<name>'` line")
            port, state = match[1], None
        elif match := re.fullmatch(r"State:\s*(\S+)", stripped):
            state = match[1]
        elif (match := re.fullmatch(r"Rate:\s*(\S+)", stripped)) and port is not None:
            try:
                rate = float(match[1])
            except ValueError:
                raise TagInputError(tool, f"line {number}: rate {match[1]!r} is not a number of Gb/s") from None
            if state in (None, "Active"):
                nics.append(Nic(f"{adapter}/{port}", "infiniband", rate))
    if adapter is None:
        raise TagInputError(tool, "no `CA '<name>'` line: not the output of ibstat")
    return nics


def read_live(command: str) -> str:
    """What `grep . <glob>` would print for the sysfs files of `command`, read directly."""
    pattern = command.removeprefix("grep . ")
    lines = []
    for path in sorted(Path("/").glob(pattern.lstrip("/"))):
        try:
            lines.append(f"{path}:{path.read_text().strip()}")
        except OSError:  # e.g. the speed of a link that is down
            continue
    return "\n".join(lines)
