"""The graph `tag calibrate` runs: one small step per measured series, all in one tf.Graph.

Each series is a target step and a base step that touches the same devices without the payload; a
sample is (target time - fastest base time) / the payloads the target chains one after another.
Chaining (a tensor hopping a -> b -> a ..., collectives feeding the next) makes small payloads stand
out of the step's launch noise, and each payload waits for the one before, as transfers in a step do.
What is chained is what the emitter emits (tag_core.emit):

    p2p, sendrecv  an Identity on the other device of the pair: one send/recv per hop
    allreduce      CollectiveReduceV2 (a sum) on every member of the group
    ps             the variable's device sends it to the other members (pull), each sends its copy back
                   (push) and the first sums them with AddN
    broadcast      the first member's tensor read on every other member (a "duplicate" input)
    op             a chain of scalar Adds on one device (the executor's per-op cost)
    gap            32 independent 4 KB tensors made on one device and read on the other (base: read where
                   they are made): what one more transfer adds when the latencies overlap
    overlap_*      a matmul chain on each device of a pair (compute), a 1 MB tensor hopping between them
                   (comm), and both in one step: how much of moving the bytes the compute hides
    send_*         a 4 KB tensor sent at the start of the step, on which the receiver's matmul chain waits,
                   the sender idle or running the same chain: how long a computing sender delays a transfer
    feed           a tensor the client feeds to task 0 each step, as it feeds the batch (link "client";
                   not chained: a step is fed once; sizes from 64 KB, where a feed stands out of the noise)
    step           one tiny op per task, raw step times (no base)

Payloads are float32 variables (bytes / 4 elements), zeros, read with ReadVariableOp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .calibrate import CalibrationSettings

CHAIN_BYTES = 32 * 2**20  # payloads up to this many bytes in all are chained in one step
MAX_CHAIN = 32  # small payloads must stand out of the noise of the step around them
OVERLAP_MATMULS, OVERLAP_SIDE = 600, 64  # the overlap series' compute: 600 chained 64 x 64 matmuls per device
OVERLAP_HOPS, OVERLAP_BYTES = 8, 2**20  # ... and its transfers: 1 MB hopping 8 times (bytes, not latency)
OVERLAP_RUNS = 3  # their share is a small difference of three times: more runs
SEND_BYTES = 4096  # the send series' tensor: latency, not bytes
GAP_TRANSFERS = 32  # the gap series: this many independent 4 KB tensors cross one link in one step
FEED_MIN_BYTES = 64 * 2**10


@dataclass
class Series:
    kind: str
    link: str | None
    group_size: int | None
    bytes: int | None
    target: Any  # the op session.run runs
    base: Any | None  # the same devices without the payload; None: samples are raw step times
    per_step: int  # payloads chained in one run of target
    devices: tuple[str, ...]
    feed: Any | None = None  # the placeholder the client feeds `bytes` to in the target
    runs: int = 1  # timed runs per round: the overlap series are compared by small differences

    def feed_dict(self) -> dict | None:
        """The target's feed, made once so that making it is not timed."""
        if self.feed is None:
            return None
        import numpy as np

        return {self.feed: np.zeros(self.bytes // 4, np.float32)}

    @property
    def label(self) -> str:
        size = f" {format_bytes(self.bytes)}" if self.bytes else ""
        group = f" x{self.group_size}" if self.kind in ("allreduce", "ps", "broadcast", "step") else ""
        return f"{self.kind}{' ' + self.link if self.link else ''}{group}{size}"


def format_bytes(nbytes: int) -> str:
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def chain_length(nbytes: int) -> int:
    return max(1, min(MAX_CHAIN, CHAIN_BYTES // nbytes))


class CalibrationGraph:
    """Builds the series into one graph; `init` sets every variable."""

    def __init__(self, collective_timeout_s: float):
        import tensorflow as tf

        self.tf = tf
        self.graph = tf.Graph()
        self.timeout_s = float(collective_timeout_s)
        self.variables: dict[tuple[str, int], Any] = {}
        self.group_keys: dict[tuple[str, ...], int] = {}
        self.instances = 0
        self.series: list[Series] = []
        self._init = None

    @property
    def init(self):
        if self._init is None:
            with self.graph.as_default():
                self._init = self.tf.group(*[v.initializer for v in self.variables.values()], name="calibration_init")
        return self._init

    def _read(self, device: str, nbytes: int):
        """A read of a zero float32 variable of `nbytes` on `device` (one variable per device and size)."""
        tf = self.tf
        key = (device, nbytes)
        if key not in self.variables:
            with tf.device(device):
                self.variables[key] = tf.Variable(tf.zeros([nbytes // 4], tf.float32), trainable=False,
                                                  name=f"payload_{len(self.variables)}")
        with tf.device(device):
            return tf.raw_ops.ReadVariableOp(resource=self.variables[key].handle, dtype=tf.float32)

    def _done(self, tensors: list, devices: tuple[str, ...]):
        """One op on the first device that waits for `tensors` (nothing is fetched back to the client)."""
        with self.tf.device(devices[0]):
            return self.tf.group(*tensors)

    def _base(self, devices: tuple[str, ...]):
        tf = self.tf
        ticks = []
        for device in devices:
            read = self._read(device, 4)
            with tf.device(device):
                ticks.append(tf.raw_ops.AddV2(x=read, y=read))
        return self._done(ticks, devices)

    def _add(self, kind: str, link: str | None, devices: tuple[str, ...], nbytes: int | None, final: list,
             per_step: int, base: bool = True, runs: int = 1) -> None:
        with self.graph.as_default():
            target = self._done(final, devices)
            self.series.append(Series(kind, link, len(devices) if kind != "op" else None, nbytes, target,
                                      self._base(devices) if base else None, per_step, devices, runs=runs))

    # ---- the series -------------------------------------------------------------

    def p2p(self, a: str, b: str, link: str, nbytes: int, hops: int | None = None, kind: str = "p2p") -> None:
        tf = self.tf
        hops = hops or chain_length(nbytes)
        with self.graph.as_default():
            x = self._read(a, nbytes)
            for hop in range(hops):
                with tf.device(b if hop % 2 == 0 else a):
                    x = tf.raw_ops.Identity(input=x)
        self._add(kind, link, (a, b), nbytes, [x], hops)

    def allreduce(self, devices: tuple[str, ...], link: str, nbytes: int) -> None:
        tf = self.tf
        chain = chain_length(nbytes)
        group_key = self.group_keys.setdefault(devices, len(self.group_keys) + 1)
        with self.graph.as_default():
            values = [self._read(d, nbytes) for d in devices]
            for _ in range(chain):
                self.instances += 1
                reduced = []
                for value, device in zip(values, devices):
                    with tf.device(device):
                        reduced.append(tf.raw_ops.CollectiveReduceV2(
                            input=value, group_size=len(devices), group_key=group_key, instance_key=self.instances,
                            ordering_token=[], merge_op="Add", final_op="Id", communication_hint="auto",
                            timeout_seconds=self.timeout_s))
                values = reduced
        self._add("allreduce", link, devices, nbytes, values, chain)

    def ps(self, devices: tuple[str, ...], link: str, nbytes: int) -> None:
        tf = self.tf
        chain = chain_length(nbytes)
        server, workers = devices[0], devices[1:]
        with self.graph.as_default():
            x = self._read(server, nbytes)
            for _ in range(chain):
                pulled = []
                for device in workers:
                    with tf.device(device):
                        pulled.append(tf.raw_ops.Identity(input=x))
                with tf.device(server):
                    x = tf.raw_ops.AddN(inputs=[x, *pulled])
        self._add("ps", link, devices, nbytes, [x], chain)

    def broadcast(self, devices: tuple[str, ...], link: str, nbytes: int) -> None:
        tf = self.tf
        chain = chain_length(nbytes)
        source, receivers = devices[0], devices[1:]
        with self.graph.as_default():
            x = self._read(source, nbytes)
            for _ in range(chain):
                copies = []
                for device in receivers:
                    with tf.device(device):
                        copies.append(tf.raw_ops.Identity(input=x))
                with tf.device(source), tf.control_dependencies(copies):
                    x = tf.raw_ops.Identity(input=x)  # the next broadcast starts when every copy has arrived
        self._add("broadcast", link, devices, nbytes, [x], chain)

    def op_chain(self, device: str, length: int) -> None:
        tf = self.tf
        with self.graph.as_default():
            x = self._read(device, 4)
            for _ in range(length):
                with tf.device(device):
                    x = tf.raw_ops.AddV2(x=x, y=x)  # no constants: each op of the chain is one dispatch
        self._add("op", None, (device,), None, [x], length)

    def overlap(self, a: str, b: str, link: str) -> None:
        """Five series on the pair: compute on both, hops between them, the two at once (independent), and a
        tensor a sends b's compute at the start, a idle or computing too."""
        tf = self.tf

        def matmuls(device: str, after=None):
            value = self._read(device, OVERLAP_SIDE * OVERLAP_SIDE * 4)
            with tf.device(device):
                x = tf.reshape(value, [OVERLAP_SIDE, OVERLAP_SIDE])
                if after is not None:
                    x = x + after  # the chain waits for the tensor
                for _ in range(OVERLAP_MATMULS):
                    x = tf.linalg.matmul(x, x)
            return x

        def compute() -> list:
            return [matmuls(a), matmuls(b)]

        def hops() -> list:
            x = self._read(a, OVERLAP_BYTES)
            for hop in range(OVERLAP_HOPS):
                with tf.device(b if hop % 2 == 0 else a):
                    x = tf.raw_ops.Identity(input=x)
            return [x]

        def sent(busy: bool) -> list:
            with tf.device(b):
                arrived = tf.math.reduce_sum(tf.raw_ops.Identity(input=self._read(a, SEND_BYTES)))
            return [matmuls(b, arrived)] + ([matmuls(a)] if busy else [])

        for kind, build in (("overlap_compute", compute), ("overlap_comm", hops),
                            ("overlap_both", lambda: compute() + hops()),
                            ("send_idle", lambda: sent(False)), ("send_busy", lambda: sent(True))):
            with self.graph.as_default():
                final = build()
            self._add(kind, link, (a, b), None, final, 1, runs=OVERLAP_RUNS)

    def gap(self, a: str, b: str, link: str) -> None:
        """GAP_TRANSFERS distinct tensors made on b, read on a; the base reads them on b."""
        tf = self.tf

        def tensors(where: str) -> list:
            value = self._read(b, 4096)
            made = []
            for k in range(GAP_TRANSFERS):
                with tf.device(b):
                    made.append(tf.raw_ops.AddV2(x=value, y=tf.constant(float(k))))  # distinct: one send each
            with tf.device(where):
                return [tf.raw_ops.Identity(input=x) for x in made]

        with self.graph.as_default():
            target, base = self._done(tensors(a), (a, b)), self._done(tensors(b), (a, b))
        self.series.append(Series("gap", link, 2, 4096, target, base, GAP_TRANSFERS, (a, b)))

    def feed(self, device: str, nbytes: int) -> None:
        tf = self.tf
        with self.graph.as_default():
            with tf.device(device):
                placeholder = tf.compat.v1.placeholder(tf.float32, [None], name=f"feed_{len(self.series)}")
                target = tf.group(tf.raw_ops.Identity(input=placeholder))
            base = self._base((device,))
        self.series.append(Series("p2p", "client", 1, nbytes, target, base, 1, (device,), feed=placeholder))

    def step(self, devices: tuple[str, ...]) -> None:
        with self.graph.as_default():
            target = self._base(devices)
        self.series.append(Series("step", None, len(devices), None, target, None, 1, devices))


def default_group_sizes(members: int) -> list[int]:
    """2, the powers of two below `members`, and `members`."""
    sizes = {members} | {2**k for k in range(1, members.bit_length()) if 2**k <= members}
    return sorted(s for s in sizes if s >= 2)


def build_series(graph: CalibrationGraph, tasks: list[list[str]], settings: CalibrationSettings) -> None:
    """Every series for a cluster whose task k has the devices tasks[k]: "inter" between the first devices
    of different tasks, "intra" between the GPUs of the first task that has several. (Logical CPU devices
    of one task share its memory: a tensor passes between them by reference, whatever its size.)"""
    inter = [t[0] for t in tasks]
    intra = next((t for t in tasks if len(t) >= 2 and "/device:GPU:" in t[0]), None)
    pairs = ([("inter", inter[0], inter[1])] if len(inter) >= 2 else []) + \
            ([("intra", intra[0], intra[1])] if intra else [])
    groups = [("inter", tuple(inter))] + ([("intra", tuple(intra))] if intra else [])
    graph.step(tuple(inter[:1]))
    if len(inter) > 1:
        graph.step(tuple(inter))
    graph.op_chain(inter[0], settings.chain_ops)
    fed = [nbytes for nbytes in settings.sizes if nbytes >= FEED_MIN_BYTES]
    for nbytes in fed if len(fed) >= 2 else ():  # a fit needs two sizes; without, feeds stay uncharged
        graph.feed(inter[0], nbytes)
    for link, a, b in pairs:
        graph.p2p(a, b, link, 4, hops=settings.transfer_hops, kind="sendrecv")
        graph.overlap(a, b, link)
        graph.gap(a, b, link)
        for nbytes in settings.sizes:
            graph.p2p(a, b, link, nbytes)
    for link, members in groups:
        wanted = settings.group_sizes or default_group_sizes(len(members))
        for size in sorted(s for s in wanted if 2 <= s <= len(members)):
            for nbytes in settings.sizes:
                graph.allreduce(members[:size], link, nbytes)
                graph.ps(members[:size], link, nbytes)
                graph.broadcast(members[:size], link, nbytes)


def session_config(timeout_s: float):
    """The client session's config: the collective leader, and no graph rewrites, so that each step runs
    the ops it was built with (grappler and the classic optimizer would fold the op chain and drop
    the Identity hops)."""
    import tensorflow as tf

    from .local_cluster import server_config

    config = server_config(threads=None)
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
    config.graph_options.optimizer_options.do_constant_folding = False
    config.graph_options.optimizer_options.do_common_subexpression_elimination = False
    config.operation_timeout_in_ms = int(timeout_s * 1000)
    return config
