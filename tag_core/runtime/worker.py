"""The process that runs an emitted step: TF servers, the session, and the single-device check.

`tag run` starts it as a child (tag_core.runtime.supervisor) so that a hung collective or a server
that will not stop is ended with the process. It reports one JSON object per line on
stdout: {"event": "start" | "step" | "serving" | "error" | "input_error" | "done", ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .local_cluster import add_target_arguments, session_target
from .parent_watch import exit_with_parent
from .warmup import MAX_WARMUP_STEPS, still_warming

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

LEADER = "/job:worker/replica:0/task:0"
def report(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}, default=float), flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(cpus: int | None = None, soft: bool = False):
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto(allow_soft_placement=soft)
    if cpus is not None:
        config.device_count["CPU"] = cpus
    config.experimental.collective_group_leader = LEADER
    return config


def loopback_only() -> bool:
    """Whether this process runs in the local run's network namespace, whose only interface is lo (it joined
    one when the package was imported: tag_core.runtime.loopback)."""
    from .loopback import JOIN_ENV, interfaces

    return bool(os.environ.get(JOIN_ENV)) and interfaces() == ["lo"]


def _spec_like(meta: dict):
    """A ModelSpec carrying only the input signature: enough for `synthetic_batch`."""
    from tag_core.capture.models.spec import InputSpec, ModelSpec

    specs = [InputSpec(i["name"], tuple(i["shape"]), i["dtype"], i["max_value"]) for i in meta["inputs"]]
    return ModelSpec(name="emitted", build=lambda: None, inputs=specs[:-1], label=specs[-1])


class FolderError(Exception):
    """A file of the emitted folder that cannot be read: the user's input, reported as such."""


def initial_values(folder: Path, meta: dict) -> list[np.ndarray]:
    """Each variable's initial value: stored exactly, or drawn from its recorded mean and spread."""
    stored = None
    if (folder / "initial_values.npz").exists():
        try:
            stored = dict(np.load(folder / "initial_values.npz", allow_pickle=False))
        except Exception as exc:  # truncated or foreign: zipfile, EOF and value errors alike
            raise FolderError(f"{folder / 'initial_values.npz'} cannot be read ({type(exc).__name__}); "
                              "emit the folder again") from None
    values = []
    for v in meta["variables"]:
        init, shape, dtype = v["init"], tuple(v["shape"]), v["dtype"]
        if "npz" in init:
            if stored is None or init["npz"] not in stored:
                raise FolderError(f"{folder / 'initial_values.npz'} lacks the value of {v['name']}; emit the folder again")
            values.append(stored[init["npz"]])
        elif "fill" in init:
            values.append(np.full(shape, init["fill"], dtype=dtype))
        else:
            mean, std = init["normal"]
            values.append(np.random.default_rng(init["seed"]).normal(mean, std, shape).astype(dtype))
    return values


def _load_graph_def(folder: Path, meta: dict, timeout: float, on_cpu: bool, runs: int | None = None,
                    share: float = 1.0):
    """The folder's GraphDef, its collectives timed out as tag_core.runtime.collective_timeout says for `runs`
    executions of the step (None: unbounded) and `share` of the watchdog budget."""
    import tensorflow as tf
    from google.protobuf.message import DecodeError

    from .collective_timeout import collective_timeout_s

    graph_def = tf.compat.v1.GraphDef()
    try:
        graph_def.ParseFromString((folder / "graph.pb").read_bytes())
    except DecodeError:
        raise FolderError(f"{folder / 'graph.pb'} is not a GraphDef (corrupt or truncated); emit the folder again") from None
    collective_timeout = collective_timeout_s(meta, timeout, runs, share)
    for node in graph_def.node:
        if node.op.startswith("Collective"):
            # A missing peer fails the step naming the op, before the session's own deadline (which names none).
            node.attr["timeout_seconds"].f = collective_timeout
        if on_cpu:
            node.device = node.device.replace("/device:GPU:", "/device:CPU:")
    return graph_def


class Distributed:
    """The emitted step in a session on the cluster's servers."""

    def __init__(self, graph_def, meta: dict, target: str, soft: bool, rewrites: bool = True,
                 threads: int | None = None):
        import tensorflow as tf

        from tag_core.fusion.regions import turn_off

        self.meta = meta
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
            self.reads = []  # (variable index, copy index, tensor) for every copy of every variable
            for i, v in enumerate(meta["variables"]):
                for j, (handle, device, _) in enumerate(v["copies"]):
                    with tf.device(device):
                        tensor = tf.raw_ops.ReadVariableOp(resource=self.graph.get_tensor_by_name(handle + ":0"),
                                                           dtype=tf.as_dtype(v["dtype"]))
                    self.reads.append((i, j, tensor))
        config = turn_off(_config(soft=soft), meta.get("rewrites_off", []))  # compiled regions need them off
        if not rewrites:  # grappler re-optimises every partition per fetch set: 20 of 25 s at 26,000 ops
            config.graph_options.rewrite_options.disable_meta_optimizer = True
        if threads:  # a direct session (tag_core.runtime.direct) sized as one task
            from tag_core.profile.timing import pool_sizes

            config.intra_op_parallelism_threads, config.inter_op_parallelism_threads = pool_sizes(threads)
        self.session = tf.compat.v1.Session(target, graph=self.graph, config=config)

    def initialise(self, values: list[np.ndarray], options) -> None:
        feed = dict(zip(self.meta["init_values"], values))
        self.session.run(self.meta["init_op"], feed_dict=feed, options=options)

    def step(self, batch: list[np.ndarray], options) -> float:
        feed = dict(zip(self.meta["input_tensors"], batch))
        loss, _ = self.session.run([self.meta["loss_tensor"], self.meta["train_op"]], feed_dict=feed, options=options)
        return float(loss)

    def variables(self, options) -> list[tuple[int, int, np.ndarray]]:
        """(variable index, copy index, value) of every copy."""
        values = self.session.run([t for _, _, t in self.reads], options=options)
        return [(i, j, v) for (i, j, _), v in zip(self.reads, values)]


def waiting_collectives(message: str, meta: dict) -> list[dict]:
    """Collective ops named in a TF error message, with the devices of their group."""
    named = set(re.findall(r"\{\{node ([^}]+)\}\}", message)) | set(re.findall(r"node '([^']+)'", message))
    found = [c for c in meta["collectives"] if c["node"] in named]
    return found


def _headline(message: str) -> str:
    """The informative line of a TF error (its first line is often just 'Graph execution error:')."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    useful = [line for line in lines if line != "Graph execution error:" and not line.startswith(("Detected at", "Node:"))]
    return (useful or lines or [""])[0][:500]


def connect_tasks(args, meta: dict) -> tuple[str, list, bool] | None:
    """(session target, the servers this process holds, whether GPU devices run as CPU) for the tasks of `meta`:
    pinned servers already running (--target), this machine's task of a real cluster (--cluster; a task other
    than 0 serves here until stopped and None is returned), or in-process local servers. See
    `add_task_arguments`."""
    import tensorflow as tf

    if args.target:  # pinned mode: the tasks serve in processes of their own (tag_core.runtime.local_cluster)
        return session_target(args.target, args.client_cluster), [], meta["device_kind"] == "gpu"
    if args.cluster:
        cluster = json.loads(Path(args.cluster).read_text())["cluster"]
        cpus = meta["tasks"][args.task_index] if meta["device_kind"] == "cpu" else None
        server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="worker", task_index=args.task_index,
                                      config=_config(cpus=cpus, soft=True), start=True)
        if args.task_index != 0:
            report("serving", task=args.task_index, target=server.target, pid=os.getpid())
            server.join()
            return None
        return server.target, [server], False
    addresses = [f"127.0.0.1:{_free_port()}" for _ in meta["tasks"]]
    spec = tf.train.ClusterSpec({"worker": addresses})
    servers = [tf.distribute.Server(spec, job_name="worker", task_index=k, config=_config(cpus=count), start=True)
               for k, count in enumerate(meta["tasks"])]
    return servers[0].target, servers, meta["device_kind"] == "gpu"


def add_task_arguments(parser) -> None:
    """Where the tasks are: --cluster/--task-index (a real cluster), --target (pinned servers), else local ones."""
    parser.add_argument("--cluster")
    parser.add_argument("--task-index", type=int, default=0)
    add_target_arguments(parser, required=False)  # pinned mode: servers already running


def run(args) -> int:
    import tensorflow as tf

    from tag_core.capture.trace import synthetic_batch

    from .check import Reference, compare

    folder = Path(args.folder)
    plan = json.loads((folder / "plan.json").read_text())
    meta = plan["emission"]
    deadline = time.monotonic() + args.timeout
    connected = connect_tasks(args, meta)
    if connected is None:  # a task of a real cluster other than 0: it served until stopped
        return 0
    target, servers, on_cpu = connected
    warmup_runs = max(args.warmup, MAX_WARMUP_STEPS) if args.warmup_seconds else args.warmup
    graph_def = _load_graph_def(folder, meta, args.timeout, on_cpu, runs=args.steps + warmup_runs)
    values = initial_values(folder, meta)
    report("start", tasks=len(meta["tasks"]), devices=sum(meta["tasks"]), ops=len(graph_def.node),
           gpu_as_cpu=on_cpu, check=args.check, pinned=target is not None, warmup=args.warmup,
           warmup_seconds=args.warmup_seconds,
           loopback_only=loopback_only())
    distributed = Distributed(graph_def, meta, target, soft=bool(args.cluster),
                              rewrites=not args.rewrites_off)
    statistics = meta.get("batch_statistics") or {}
    skip = statistics.get("skip")
    reference = Reference(folder, meta) if args.check and not skip else None
    if args.check:
        report("check", reference=reference.kind if reference else None, skipped=skip,
               statistics=len(statistics.get("ops", [])))
    spec = _spec_like(meta)

    def options():
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            raise tf.errors.DeadlineExceededError(None, None, "the run's time is up")
        return tf.compat.v1.RunOptions(timeout_in_ms=remaining_ms)

    stage = "initialising variables"
    failed = 0
    try:
        distributed.initialise(values, options())
        if reference:
            reference.initialise(values)
        step = warm = 0
        began = time.monotonic()
        while step - warm < args.steps:
            warming = still_warming(warm, time.monotonic() - began, args.warmup, args.warmup_seconds)
            stage = f"step {step}"
            batch = synthetic_batch(spec, plan["batch_size"], seed=step)  # made before the clock starts
            start = time.perf_counter()
            loss = distributed.step(batch, options())
            seconds = time.perf_counter() - start
            fields: dict[str, Any] = {"step": step, "loss": loss, "seconds": seconds}
            step += 1
            if warming:
                fields["warmup"] = True
                warm += 1
            if reference:
                fields.update(compare(distributed, reference, batch, loss, options(), meta))
                failed += not fields["passed"]
            report("step", **fields)
    except tf.errors.OpError as exc:
        message = str(exc)
        report("error", stage=stage, kind=type(exc).__name__, message=_headline(message),
               waiting=waiting_collectives(message, meta))
        return 1
    report("done", steps=step, warmup=warm, failed_steps=failed)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tag_core.runtime.worker")
    parser.add_argument("folder")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--timeout", type=float, default=300.0)
    add_task_arguments(parser)
    parser.add_argument("--warmup", type=int, default=0, help="untimed steps before --steps")
    parser.add_argument("--warmup-seconds", type=float, default=0.0,
                        help=f"... and more, until this long has passed (at most {MAX_WARMUP_STEPS} steps in all)")
    parser.add_argument("--rewrites-off", action="store_true",
                        help="no grappler rewrites in the distributed session (a check of the graph, not a timing)")
    exit_with_parent()
    try:
        return run(parser.parse_args(argv))
    except FolderError as exc:
        report("input_error", where="DIR", message=str(exc))
        return 2


if __name__ == "__main__":
    sys.exit(main())
