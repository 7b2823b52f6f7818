"""GPU nodes of a Kubernetes cluster from `kubectl get nodes -o json` (or `-o yaml`): NVIDIA GPU feature
discovery's labels (`nvidia.com/gpu.product`, `nvidia.com/gpu.count`, `nvidia.com/gpu.memory` in MiB) and the
topology labels (`topology.kubernetes.io/zone`, a rack label such as `topology.kubernetes.io/rack`). Nodes
without GPU labels are left out, and counted."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tag_core.errors import TagInputError

PRODUCT, COUNT, MEMORY = "nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/gpu.memory"
ZONE_LABELS = ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone")
RACK_LABELS = ("topology.kubernetes.io/rack", "rack")


@dataclass(frozen=True)
class GpuNode:
    name: str
    product: str
    count: int
    memory_mib: float | None
    zone: str | None
    rack: str | None


def read_nodes(path: Path) -> tuple[list[GpuNode], int]:
    """(the GPU nodes, how many nodes had no GPU labels) of a `kubectl get nodes -o json` or `-o yaml` file (a
    List, or one Node)."""
    tool = f"kubectl get nodes ({path})"
    try:
        text = path.read_text()
    except OSError as exc:
        raise TagInputError(tool, str(exc)) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        if text.lstrip().startswith(("{", "[")):
            raise TagInputError(tool, f"not JSON: {exc}") from None
        data = _yaml(text, tool)
    items = data.get("items") if isinstance(data, dict) and data.get("kind") != "Node" else [data]
    if not isinstance(items, list):
        raise TagInputError(tool, "neither a List of nodes (`items`) nor a Node")
    nodes, without = [], 0
    for index, item in enumerate(items):
        metadata = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str):
            raise TagInputError(tool, f"items[{index}]: a node without metadata.name")
        labels = metadata.get("labels") or {}
        if PRODUCT not in labels or COUNT not in labels:
            without += 1
            continue
        count = labels[COUNT]
        if not str(count).isdigit() or int(count) < 1:
            raise TagInputError(tool, f"items[{index}] {metadata['name']}: {COUNT} {count!r} is not a GPU count")
        memory = labels.get(MEMORY)
        nodes.append(GpuNode(metadata["name"], labels[PRODUCT], int(count),
                             float(memory) if str(memory or "").isdigit() else None,
                             next((labels[k] for k in ZONE_LABELS if k in labels), None),
                             next((labels[k] for k in RACK_LABELS if k in labels), None)))
    return nodes, without


def _yaml(text: str, tool: str):
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise TagInputError(tool, f"not JSON, and not YAML: {where}{problem}") from None
