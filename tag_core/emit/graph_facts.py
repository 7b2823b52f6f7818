"""What one training step of an emitted graph makes the runtime do, counted from its GraphDef."""

from __future__ import annotations


def graph_facts(graph_def, fetches: list[str]) -> dict:
    """What one training step (the ops `fetches` need, not the initialisation) makes the runtime do: ops per
    task, tensors and control edges that cross tasks (each a send/recv pair at most), collective ops."""
    nodes = {node.name: node for node in graph_def.node}

    def task(name: str) -> str:
        device = nodes[name].device
        return device.split("/task:")[1].split("/")[0] if "/task:" in device else "?"

    step, todo = set(), [f.split(":")[0] for f in fetches]
    while todo:
        name = todo.pop()
        if name in nodes and name not in step:
            step.add(name)
            todo += [i.lstrip("^").split(":")[0] for i in nodes[name].input]
    ops: dict[str, int] = {}
    data, control = set(), set()
    for name in step:
        ops[task(name)] = ops.get(task(name), 0) + 1
        for source in nodes[name].input:
            if source.lstrip("^").split(":")[0] in step and task(source.lstrip("^").split(":")[0]) != task(name):
                # Counted once per (source, receiving task): the most send/recv pairs TF may fold them into.
                (control if source.startswith("^") else data).add((source.lstrip("^"), task(name)))
    return {"ops_per_task": dict(sorted(ops.items())), "cross_task_tensors": len(data),
            "cross_task_control_edges": len(control),
            "collectives": sum(nodes[name].op.startswith("Collective") for name in step)}
