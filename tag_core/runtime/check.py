"""`tag run --check`: the single-device step on the same data and initial values, and the comparison.

Each step is compared from the same variables: the reference and every copy of the emitted graph start
the step with equal values, and after the comparison every copy restarts from the reference's. One
step is what "computes the same training step" means; over many steps, models with batch norm on small
sub-batches or vanishing gradients are chaotic, and rounding differences would compound past any
tolerance however right the graph is.

Left out of a step's comparison, and named: gradient elements that float32 does not determine, i.e.
under NOISE_GRADIENT of the step's largest gradient (attention key biases, a bias before batch norm:
exactly zero in real arithmetic) or moving by more than NOISE_RELATIVE of themselves when the same
gradient is summed over sub-batches (exact in real arithmetic; what data parallelism does). Adam
divides each element by its own size, so the updates such elements make are arbitrary.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from tag_core.capture.trace import INIT_SCOPE
from tag_core.emit.analysis import is_random_op

TOLERANCE = 1e-4
NOISE_GRADIENT = 1e-6
NOISE_RELATIVE = 1e-5


def _config(cpus: int):
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto()
    config.device_count["CPU"] = cpus
    return config


class _Step:
    """One traced single-device step in its own session on this process's CPU."""

    def __init__(self, folder: Path, meta_file: str):
        import tensorflow as tf

        from tag_core.capture.steps import load_step

        self.step_def = load_step(folder / meta_file)
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf.compat.v1.import_graph_def(self.step_def.graph_def, name="")
            self.reads = [tf.raw_ops.ReadVariableOp(resource=self.graph.get_tensor_by_name(v.handle_node + ":0"),
                                                    dtype=tf.as_dtype(v.dtype)) for v in self.step_def.variables]
        self.session = tf.compat.v1.Session(graph=self.graph, config=_config(1))
        self.with_gradient = [v for v in self.step_def.variables if v.gradient]
        # Random draws of the step (dropout masks), in graph order: a step traced at another batch size
        # has the same ones in the same order.
        self.random = [n.name + ":0" for n in self.step_def.graph_def.node
                       if is_random_op(n.op) and not n.name.startswith(INIT_SCOPE + "/")]
        self._random_shapes: list[tuple[int, ...]] | None = None

    def random_feed(self, draws: list[np.ndarray], rows_of, feed: dict) -> dict:
        """This step's random draws taken from the full batch's `draws`, as every emitted copy takes
        them (the whole batch drawn from one seed, its rows kept): a draw of the same shape as a whole,
        one over this step's rows as `rows_of(draw)`."""
        if len(draws) != len(self.random):
            return {}
        if self._random_shapes is None:
            self._random_shapes = [np.shape(v) for v in self.session.run(self.random, feed_dict=feed)]
        out = {}
        for name, shape, draw in zip(self.random, self._random_shapes, draws):
            if shape == draw.shape:
                out[name] = draw
            elif shape[1:] == draw.shape[1:] and rows_of(draw).shape == shape:
                out[name] = rows_of(draw)
        return out

    def initialise(self, values: list[np.ndarray]) -> None:
        self.session.run(self.step_def.init_op,
                         feed_dict={f"tag_init/value_{i}:0": v for i, v in enumerate(values)})

    def feed(self, batch: list[np.ndarray]) -> dict:
        return dict(zip(self.step_def.input_tensors, batch))

    def variables(self) -> list[np.ndarray]:
        return self.session.run(self.reads)


class Reference:
    """The single-device step on the same data and initial values.

    With batch statistics computed per replica (batch norm in a split placement), the equivalent
    reference runs the step on each replica's rows, combines the losses, gradients and recorded
    statistics weighted by the replicas' batch shares, and applies the update once with them. Steps run
    on part of the batch take their random draws (dropout masks) from the full batch's, as the emitted
    copies do.
    """

    def __init__(self, folder: Path, meta: dict):
        self.main = _Step(folder, meta["reference"])
        statistics = meta.get("batch_statistics") or {}
        self.rows: list[int] = statistics.get("rows") or []
        self.writes: list[str] = statistics.get("writes") or []
        partition = meta.get("noise_partition") or {}
        self.other_rows: list[int] = [] if self.rows else partition.get("rows") or []
        files = {**(partition.get("references") or {}), **(statistics.get("references") or {})}
        self.parts = {int(b): _Step(folder, f) for b, f in files.items()}
        # Elements left out of this step's comparison, per variable (see the module docstring).
        self.noise: dict[str, np.ndarray] = {}
        self.slots = _slot_owners(self.main.step_def.variables)
        if self.rows:
            self.kind = f"single-device step on each replica's rows {self.rows}, combined by batch share"
        else:
            self.kind = "single-device step"

    def initialise(self, values: list[np.ndarray]) -> None:
        self.main.initialise(values)

    def variables(self) -> list[np.ndarray]:
        return self.main.variables()

    def step(self, batch: list[np.ndarray]) -> float:
        main = self.main
        other = None
        self.noise = {}  # per step: every step starts from the same values
        values = main.variables()
        if not self.rows:
            loss, _, gradients, draws = main.session.run(
                [main.step_def.loss_tensor, main.step_def.train_ops, [v.gradient for v in main.with_gradient],
                 main.random], feed_dict=main.feed(batch))
            if self.other_rows:  # the same gradient summed over sub-batches, from the same values
                other = self._combined(batch, self.other_rows, values, draws)[1]
        else:
            draws = main.session.run(main.random, feed_dict=main.feed(batch))
            loss, gradients, written = self._combined(batch, self.rows, values, draws)
            # Each replica's rows in reverse order: the same gradient in exact arithmetic (batch statistics
            # and the mean loss do not depend on the order), summed in another order.
            other = self._combined(batch, self.rows, values, draws, reverse=True)[1]
            feed = main.feed(batch)
            feed.update(zip([v.gradient for v in main.with_gradient], gradients))
            feed.update(zip(self.writes, written))
            main.session.run(main.step_def.train_ops, feed_dict=feed)  # the update, from the combined values
        self._note_noise(gradients, other)
        return float(loss)

    def _combined(self, batch: list[np.ndarray], row_split: list[int], values: list[np.ndarray],
                  draws: list[np.ndarray], reverse: bool = False):
        """Loss, gradients and recorded statistics of the step run from `values` on each part of the batch,
        with the full batch's random `draws`, weighted by the parts' shares (nothing is updated)."""
        total = sum(row_split)
        loss, gradients, written, lo = 0.0, None, None, 0
        for rows in row_split:
            part = self.parts[rows]
            part.initialise(values)

            def rows_of(a, lo=lo, rows=rows):
                return a[lo:lo + rows][::-1] if reverse else a[lo:lo + rows]

            feed = part.feed([rows_of(a) for a in batch])
            feed.update(part.random_feed(draws, rows_of, feed))
            fetches = [part.step_def.loss_tensor, [v.gradient for v in part.with_gradient], self.writes]
            l, g, w = part.session.run(fetches, feed_dict=feed)
            share = rows / total
            loss += share * float(l)
            # Sparse gradients (embedding rows) have no fixed shape to add up: left as None.
            g = [share * x if np.shape(x) == tuple(v.shape) else None for x, v in zip(g, part.with_gradient)]
            gradients = g if gradients is None else [None if a is None else a + x for a, x in zip(gradients, g)]
            written = [share * x for x in w] if written is None else [a + share * x for a, x in zip(written, w)]
            lo += rows
        return loss, gradients, written

    def _note_noise(self, gradients: list[np.ndarray], other: list[np.ndarray] | None) -> None:
        """Mark the gradient elements at rounding level and those `other` (the same gradient summed in
        another order) does not reproduce (see the module docstring), with their optimizer slots."""
        largest = max((float(np.max(np.abs(g))) for g in gradients if np.size(g)), default=0.0)
        floor = NOISE_GRADIENT * largest
        by_name = {v.name: v for v in self.main.step_def.variables}
        for k, (variable, gradient) in enumerate(zip(self.main.with_gradient, gradients)):
            gradient = np.asarray(gradient)
            if gradient.shape == tuple(variable.shape):
                if float(np.max(np.abs(gradient), initial=0.0)) <= floor:  # all of it zero in real arithmetic
                    mask = np.ones(gradient.shape, dtype=bool)
                else:  # exact zeros next to real gradients are dead units: zero in any order, compared
                    mask = (np.abs(gradient) <= floor) & (gradient != 0)
                if other is not None and other[k] is not None:
                    mask |= np.abs(gradient - other[k]) > NOISE_RELATIVE * np.abs(gradient)
            else:  # sparse (IndexedSlices) gradient: the whole variable or nothing
                mask = np.full(variable.shape, float(np.max(np.abs(gradient), initial=0.0)) <= floor)
            if not mask.any():
                continue
            for name in [variable.name] + [s for s, owner in self.slots.items() if owner == variable.name]:
                if tuple(by_name[name].shape) == mask.shape:
                    self.noise[name] = self.noise[name] | mask if name in self.noise else mask

    @property
    def noise_variables(self) -> list[str]:
        """Variables with every element left out."""
        return sorted(name for name, mask in self.noise.items() if mask.all())


def _slot_owners(variables) -> dict[str, str]:
    """Optimizer slot -> the model variable whose path (with / as _) its name holds, the longest that fits."""
    keys = [(v.name.replace("/", "_"), v.name) for v in variables if v.owner == "model"]
    owners = {}
    for v in variables:
        if v.owner == "optimizer":
            matches = [(len(key), name) for key, name in keys if key in v.name]
            if matches:
                owners[v.name] = max(matches)[1]
    return owners


def relative_difference(value: np.ndarray, reference: np.ndarray) -> float:
    """max |value - reference| / max |reference| (0 when both are all zero)."""
    value, reference = np.asarray(value, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    scale = float(np.max(np.abs(reference))) if reference.size else 0.0
    diff = float(np.max(np.abs(value - reference))) if reference.size else 0.0
    if scale == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / scale


def compare(distributed, reference: Reference, batch, loss: float, options, meta: dict) -> dict:
    """Run the reference step, compare the loss and every copy of every variable of `distributed` (a
    worker.Distributed that has just run the step), then restart every copy from the reference."""
    start = time.perf_counter()
    ref_loss = reference.step(batch)
    ref_seconds = time.perf_counter() - start
    expected = reference.variables()
    worst = ("loss", relative_difference(np.array(loss), np.array(ref_loss)), "")
    copies, compared = 0, set()
    for i, j, value in distributed.variables(options):
        variable = meta["variables"][i]
        noise = reference.noise.get(variable["name"])
        want = expected[i]
        if noise is not None:
            if noise.all():
                continue
            value, want = value[~noise], want[~noise]
        copies += 1
        compared.add(i)
        diff = relative_difference(value, want)
        if diff > worst[1]:
            worst = (variable["name"], diff, variable["copies"][j][1])
    distributed.initialise(expected, options)  # the next step starts from the same values on both sides
    partial = {name: int(mask.sum()) for name, mask in reference.noise.items() if not mask.all()}
    left_out = sum(int(mask.sum()) for mask in reference.noise.values()) / max(sum(e.size for e in expected), 1)
    return {"reference_loss": ref_loss, "reference_seconds": ref_seconds,
            "compared": {"variables": len(compared), "copies": copies},
            "noise_gradient_variables": reference.noise_variables,
            "noise_elements": {"variables": len(partial), "elements": sum(partial.values())},
            "left_out_fraction": left_out,
            "max_relative_difference": worst[1], "worst": f"{worst[0]} {worst[2]}".strip(),
            "passed": worst[1] <= TOLERANCE}
