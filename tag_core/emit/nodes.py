"""NodeDef helpers for the emitter: the few ops it adds between copies of the traced step."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def parse_input(text: str) -> tuple[str, int]:
    """'^name' -> (name, -1); 'name:3' -> (name, 3); 'name' -> (name, 0)."""
    if text.startswith("^"):
        return text[1:], -1
    name, _, index = text.rpartition(":")
    if name and index.isdigit():
        return name, int(index)
    return text, 0


def task_of(device: str) -> str:
    """'/job:worker/task:3/device:CPU:0' -> '3' ('' for a device string without a task)."""
    match = re.search(r"/task:(\d+)", device)
    return match.group(1) if match else ""


def tensor_name(node: str, index: int) -> str:
    return node if index == 0 else f"{node}:{index}"


def dtype_enum(dtype: str) -> int:
    import tensorflow as tf

    return tf.as_dtype(dtype).as_datatype_enum


@dataclass
class NodeSink:
    """The emitted GraphDef's nodes, in creation order (a topological order: inputs first)."""

    nodes: list[Any] = field(default_factory=list)
    by_name: dict[str, Any] = field(default_factory=dict)
    counter: int = 0

    def unique(self, stem: str) -> str:
        self.counter += 1
        return f"tag/{stem}_{self.counter}"

    def add(self, name: str, op: str, inputs: list[str], device: str, attrs: dict[str, Any] | None = None):
        from tensorflow.core.framework import node_def_pb2

        node = node_def_pb2.NodeDef(name=name, op=op, device=device)
        node.input.extend(inputs)
        for key, value in (attrs or {}).items():
            _set_attr(node.attr[key], value)
        return self.append(node)

    def gather(self, name: str, nodes: list[str], device: str):
        """A NoOp `name` on `device` that waits for `nodes`, each other task's through a NoOp of its own: a
        control edge across tasks is a send/recv pair, which costs a step about 0.3 ms on loopback."""
        by_task: dict[str, list[str]] = {}
        for node in dict.fromkeys(nodes):
            by_task.setdefault(task_of(self.by_name[node].device), []).append(node)
        inputs = []
        for task, members in by_task.items():
            if task == task_of(device) or len(members) == 1:
                inputs += members
            else:
                inputs.append(self.add(f"{name}/task_{task}", "NoOp", ["^" + m for m in members],
                                       self.by_name[members[0]].device).name)
        return self.add(name, "NoOp", ["^" + n for n in inputs], device)

    def append(self, node):
        if node.name in self.by_name:
            raise ValueError(f"emitter bug: node {node.name} created twice")
        self.by_name[node.name] = node
        self.nodes.append(node)
        return node

    def const(self, value: np.ndarray, device: str, stem: str = "const") -> str:
        import tensorflow as tf

        value = np.asarray(value)
        name = self.unique(stem)
        node = self.add(name, "Const", [], device, {"dtype": ("type", value.dtype.name)})
        node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
        return name

    def slice_rows(self, tensor: str, rank: int, axis: int, start: int, size: int, dtype: str, device: str) -> str:
        begin = np.zeros(rank, dtype=np.int32)
        sizes = np.full(rank, -1, dtype=np.int32)
        begin[axis], sizes[axis] = start, size
        inputs = [tensor, self.const(begin, device), self.const(sizes, device)]
        name = self.unique("slice")
        self.add(name, "Slice", inputs, device, {"T": ("type", dtype), "Index": ("type", "int32")})
        return name

    def concat(self, tensors: list[str], axis: int, dtype: str, device: str) -> str:
        if len(tensors) == 1:
            return tensors[0]
        name = self.unique("concat")
        axis_const = self.const(np.array(axis, dtype=np.int32), device)
        self.add(name, "ConcatV2", [*tensors, axis_const], device,
                 {"N": ("int", len(tensors)), "T": ("type", dtype), "Tidx": ("type", "int32")})
        return name

    def add_n(self, tensors: list[str], dtype: str, device: str) -> str:
        if len(tensors) == 1:
            return tensors[0]
        name = self.unique("sum")
        self.add(name, "AddN", list(tensors), device, {"N": ("int", len(tensors)), "T": ("type", dtype)})
        return name

    def scale(self, tensor: str, factor: float, dtype: str, device: str) -> str:
        if factor == 1.0:
            return tensor
        name = self.unique("scale")
        factor_const = self.const(np.array(factor, dtype=dtype), device)
        self.add(name, "Mul", [tensor, factor_const], device, {"T": ("type", dtype)})
        return name

    def reshape(self, tensor: str, shape: tuple[int, ...], dtype: str, device: str) -> str:
        name = self.unique("reshape")
        shape_const = self.const(np.array(shape, dtype=np.int32), device)
        self.add(name, "Reshape", [tensor, shape_const], device, {"T": ("type", dtype), "Tshape": ("type", "int32")})
        return name

    def split_sizes(self, tensor: str, sizes: list[int], dtype: str, device: str) -> list[str]:
        """Pieces of a 1-D tensor, of the given lengths."""
        name = self.unique("split")
        inputs = [tensor, self.const(np.array(sizes, dtype=np.int32), device), self.const(np.array(0, np.int32), device)]
        self.add(name, "SplitV", inputs, device,
                 {"num_split": ("int", len(sizes)), "T": ("type", dtype), "Tlen": ("type", "int32")})
        return [tensor_name(name, i) for i in range(len(sizes))]

    def all_reduce(self, tensor: str, dtype: str, device: str, group_size: int, group_key: int,
                   instance_key: int) -> str:
        """A sum over the group with TF's collective ops; every member must run its own."""
        name = f"tag/allreduce_{instance_key}/{len(self.nodes)}"
        keys = [self.const(np.array(v, dtype=np.int32), device, "collective_key")
                for v in (group_size, group_key, instance_key)]
        self.add(name, "CollectiveReduceV2", [tensor, *keys], device, {
            "T": ("type", dtype), "merge_op": ("s", "Add"), "final_op": ("s", "Id"),
            "communication_hint": ("s", "auto"), "timeout_seconds": ("f", 0.0), "is_stateless": ("b", False),
            "Nordering_token": ("int", 0), "max_subdivs_per_device": ("int", -1),
        })
        return name


def _set_attr(attr, value: tuple[str, Any]) -> None:
    kind, content = value
    if kind == "type":
        attr.type = dtype_enum(content)
    elif kind == "int":
        attr.i = int(content)
    elif kind == "s":
        attr.s = content.encode()
    elif kind == "f":
        attr.f = float(content)
    elif kind == "b":
        attr.b = bool(content)
    else:
        raise ValueError(f"unknown attr kind {kind}")
