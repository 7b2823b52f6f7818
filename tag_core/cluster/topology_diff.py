"""What changed between two topology snapshots, in words: machines gone or added, GPUs lost or gained, and
bandwidths, links and racks that moved. `tag topology diff OLD NEW` prints it; the sensor's log can too."""

from __future__ import annotations

from .topology import Topology


def _gbps(value: float) -> str:
    return f"{value:g} Gbit/s"


def describe_changes(old: Topology, new: Topology) -> list[str]:
    """One sentence a change, machines in the new snapshot's order; empty when nothing changed."""
    before = {m.name.lower(): m for m in old.machines}
    after = {m.name.lower(): m for m in new.machines}
    lines = [f"machine {m.name} is gone ({m.count} x {m.gpu.name})" for key, m in before.items() if key not in after]
    for key, m in after.items():
        was = before.get(key)
        if was is None:
            lines.append(f"machine {m.name} is new ({m.count} x {m.gpu.name})")
            continue
        if was.gpu.name != m.gpu.name:
            lines.append(f"machine {m.name}: its GPUs are {m.gpu.name}, were {was.gpu.name}")
        if was.count != m.count:
            change = "lost" if m.count < was.count else "gained"
            lines.append(f"machine {m.name}: {was.count} -> {m.count} GPUs ({abs(was.count - m.count)} {change})")
        if was.intra_gbps != m.intra_gbps:
            lines.append(f"machine {m.name}: inside, {_gbps(was.intra_gbps)} -> {_gbps(m.intra_gbps)}")
        if was.rack != m.rack:
            lines.append(f"machine {m.name}: rack {was.rack or 'none'} -> {m.rack or 'none'}")
    if old.inter_gbps != new.inter_gbps:
        lines.append(f"between machines: {_gbps(old.inter_gbps)} -> {_gbps(new.inter_gbps)}")
    old_links = {frozenset((a.lower(), b.lower())): (a, b, g) for a, b, g in old.links}
    new_links = {frozenset((a.lower(), b.lower())): (a, b, g) for a, b, g in new.links}
    for key, (a, b, gbps) in new_links.items():
        if key not in old_links:
            lines.append(f"link {a} <-> {b} is new: {_gbps(gbps)}")
        elif old_links[key][2] != gbps:
            lines.append(f"link {a} <-> {b}: {_gbps(old_links[key][2])} -> {_gbps(gbps)}")
    lines += [f"link {a} <-> {b} is gone (was {_gbps(g)})" for key, (a, b, g) in old_links.items()
              if key not in new_links]
    for level, was, now in (("rack", old.rack_uplink, new.rack_uplink), ("pod", old.pod_uplink, new.pod_uplink)):
        if was != now:
            lines.append(f"{level} uplink: {was or 'none'} -> {now or 'none'}")
    if old.name != new.name:
        lines.append(f"named {new.name}, was {old.name}")
    return lines
