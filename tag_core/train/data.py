"""Training data: a `.npz` file or `path/to/file.py:function` returning a `tf.data.Dataset`, checked against the
model's inputs, hashed, and cut into seeded epochs of whole global batches.

An `.npz` holds one array per model input, named as the input, and one named as the label (`labels` for the
zoo and plain Keras models). A function returns a `tf.data.Dataset` of `(inputs, labels)` elements: `inputs` is
one tensor (a model of one input), a tuple in the model's input order, or a dict keyed by input name. Elements
may be single samples or batches of them (they are unbatched).

Each epoch is shuffled with a seed made from the run's seed and the epoch's number, so epoch e's order is the
same in every run, and a run resumed at batch k of epoch e skips the first k batches of that same order:
`.npz` rows by a permutation of the whole set; a dataset through `shuffle` with a buffer of `SHUFFLE_BUFFER`
elements. The last partial batch of an epoch is dropped.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from tag_core.capture.models.spec import InputSpec, ModelSpec
from tag_core.errors import TagInputError

SHUFFLE_BUFFER = 10_000  # elements a dataset is shuffled over (an .npz is shuffled whole)
HASH_CHUNK = 4096  # rows hashed at once when a dataset is read through


@dataclass
class TrainingData:
    """A checked data set: rows, content hash, and either the arrays (an .npz) or the dataset (a function)."""

    reference: str
    where: str  # the argument it came from, for messages
    specs: list[InputSpec]  # the model's inputs, then its label
    rows: int
    content_hash: str
    arrays: list[np.ndarray] | None = field(default=None, repr=False)  # in the order of `specs`
    dataset: Any = field(default=None, repr=False)  # tf.data.Dataset of tuples in the order of `specs`

    def steps_per_epoch(self, batch: int) -> int:
        return self.rows // batch

    def describe(self) -> str:
        return f"{self.reference} ({self.rows:,} rows, hash {self.content_hash})"

    def epoch(self, seed: int, epoch: int, batch: int, start: int = 0) -> Any:
        """A prefetched tf.data.Dataset of the epoch's whole batches from batch `start` on (tuples of tensors)."""
        import tensorflow as tf

        if self.arrays is not None:
            tensors = [tf.constant(a) for a in self.arrays]
            rows = tf.data.Dataset.from_tensor_slices(self._order(seed, epoch, batch)[start:])
            batches = rows.map(lambda idx: tuple(tf.gather(t, idx) for t in tensors))
        else:
            shuffled = self.dataset.shuffle(min(self.rows, SHUFFLE_BUFFER), seed=epoch_seed(seed, epoch),
                                            reshuffle_each_iteration=False)
            batches = shuffled.batch(batch, drop_remainder=True).take(self.steps_per_epoch(batch)).skip(start)
        return batches.prefetch(tf.data.AUTOTUNE)

    def batches(self, seed: int, epoch: int, batch: int, start: int = 0) -> Iterator[list[np.ndarray]]:
        """The batches of `epoch` as lists of numpy arrays, ready to feed. An .npz's rows are indexed here
        directly (5 µs a batch of 32 rows, against about 1 ms through tf.data's iterator and `.numpy()`, which
        the client would take from the cores the tasks compute on); a data function's pipeline runs ahead in
        a thread of its own (`ahead`)."""
        if self.arrays is not None:
            return ([a[rows] for a in self.arrays] for rows in self._order(seed, epoch, batch)[start:])
        return ahead([t.numpy() for t in tensors] for tensors in self.epoch(seed, epoch, batch, start))

    def _order(self, seed: int, epoch: int, batch: int) -> np.ndarray:
        """An .npz's rows of each whole batch of the epoch, shuffled with (seed, epoch): steps x batch."""
        steps = self.steps_per_epoch(batch)
        return np.random.default_rng([seed, epoch]).permutation(self.rows)[: steps * batch].reshape(steps, batch)

    def in_order(self, batch: int) -> Any:
        """Every row once, in its order, in batches of `batch` (the last may be partial): for validation."""
        import tensorflow as tf

        if self.arrays is not None:
            source = tf.data.Dataset.from_tensor_slices(tuple(self.arrays))
        else:
            source = self.dataset
        return source.batch(batch).prefetch(tf.data.AUTOTUNE)


def epoch_seed(seed: int, epoch: int) -> int:
    digest = hashlib.sha256(f"{seed}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def load_data(reference: str, spec: ModelSpec, batch: int | None, where: str = "--data",
              timeout: float | None = None) -> TrainingData:
    """Load and check `reference` against `spec`'s inputs and label; with `batch`, it must hold one global batch.
    Every problem is a TagInputError naming `where` and the array, input or element."""
    from tag_core.capture.time_limit import model_timeout

    if not isinstance(reference, str) or not reference.strip():
        raise TagInputError(where, "give an .npz file or path/to/file.py:function")
    reference = reference.strip()
    specs = [*spec.inputs, spec.label]
    if ".py:" in reference:
        data = _from_function(reference, specs, where, model_timeout(timeout))
    elif reference.endswith(".npz"):
        data = _from_npz(reference, specs, where)
    else:
        raise TagInputError(where, f"{reference!r} is neither an .npz file nor path/to/file.py:function")
    if batch is not None and data.rows < batch:
        raise TagInputError(where, f"{reference} has {data.rows} rows, fewer than one global batch of {batch}")
    return data


# ---- .npz ------------------------------------------------------------------------------------------------


def _from_npz(reference: str, specs: list[InputSpec], where: str) -> TrainingData:
    import zipfile

    path = Path(reference)
    if not path.is_file():
        raise TagInputError(where, f"file {reference!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as stored:
            names = list(stored.files)
            arrays = [stored[s.name] for s in specs if s.name in names]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise TagInputError(where, f"{reference} is not a readable .npz file ({type(exc).__name__}: {exc})") from None
    missing = [s.name for s in specs if s.name not in names]
    if missing:
        _missing_arrays(reference, missing, names, specs, where)
    rows = {len(a) if a.ndim else 0 for a in arrays}
    checked = [_checked_array(a, s, f"{where} {reference}: array {s.name!r}") for a, s in zip(arrays, specs)]
    if len(rows) != 1:
        counts = ", ".join(f"{s.name} {len(a) if a.ndim else 0}" for s, a in zip(specs, arrays))
        raise TagInputError(where, f"{reference}: the arrays have different numbers of rows ({counts})")
    return TrainingData(reference, where, specs, rows.pop(), _hash_arrays(checked), arrays=checked)


def _missing_arrays(reference: str, missing: list[str], names: list[str], specs: list[InputSpec], where: str) -> None:
    label = specs[-1].name
    what = "the labels" if missing == [label] else "the model's inputs" if label not in missing else "arrays"
    raise TagInputError(where, f"{reference} has no array {', '.join(map(repr, missing))} ({what}); it holds "
                               f"{', '.join(map(repr, names)) or 'none'}, and needs "
                               f"{', '.join(repr(s.name) for s in specs)}")


def _checked_array(array: np.ndarray, spec: InputSpec, where: str) -> np.ndarray:
    expected = tuple(spec.shape)
    if array.ndim == 0 or tuple(array.shape[1:]) != expected:
        shape = "(rows, " + ", ".join(map(str, expected)) + ")" if expected else "(rows,)"
        raise TagInputError(where, f"has shape {tuple(array.shape)}; the model takes {shape}")
    return _cast(array, spec, where)


def _cast(array: np.ndarray, spec: InputSpec, where: str) -> np.ndarray:
    """`array` as the input's dtype: floats for a float input, integers (within the input's range) for an integer
    one. Anything else would change the values' meaning (uint8 pixels for a float input), so it is refused."""
    want = np.dtype(spec.dtype)
    kind = array.dtype.kind
    if want.kind == "f" and kind != "f":
        raise TagInputError(where, f"has dtype {array.dtype}; the model takes {want} (floats: convert and scale it)")
    if want.kind in "iu" and kind not in "iu":
        raise TagInputError(where, f"has dtype {array.dtype}; the model takes integers ({want})")
    if want.kind not in "fiu" and array.dtype != want:
        raise TagInputError(where, f"has dtype {array.dtype}; the model takes {want}")
    if want.kind in "iu" and array.size:
        low, high = int(array.min()), int(array.max())
        top = spec.max_value if spec.max_value is not None else np.iinfo(want).max + 1
        if low < 0 or high >= top:
            raise TagInputError(where, f"holds values in [{low}, {high}]; the model takes [0, {top})")
    return array.astype(want, copy=False)


def _hash_arrays(arrays: list[np.ndarray]) -> str:
    hashes = [hashlib.sha256(np.ascontiguousarray(a).data) for a in arrays]
    return _content_hash(hashes, [a.dtype for a in arrays], len(arrays[0]))


def _content_hash(hashes: list, dtypes: list, rows: int) -> str:
    """One hash of the arrays' values, dtypes and row count, however they were read (whole or in chunks)."""
    digest = hashlib.sha256(str(rows).encode())
    for h, dtype in zip(hashes, dtypes):
        digest.update(np.dtype(dtype).str.encode() + h.digest())
    return digest.hexdigest()[:16]


# ---- a function returning a tf.data.Dataset ----------------------------------------------------------------


def _from_function(reference: str, specs: list[InputSpec], where: str, timeout: float) -> TrainingData:
    import tensorflow as tf

    from tag_core.capture.models import call_file_function

    returned, _ = call_file_function(reference, timeout, where)
    if not isinstance(returned, tf.data.Dataset):
        raise TagInputError(where, f"{reference} returned {type(returned).__name__}; expected a tf.data.Dataset of "
                                   f"(inputs, labels)")
    dataset = _as_tuples(returned, specs, f"{where} {reference}")
    rows, content_hash = _read_through(dataset, specs, f"{where} {reference}")
    return TrainingData(reference, where, specs, rows, content_hash, dataset=dataset)


def _as_tuples(dataset, specs: list[InputSpec], where: str):
    """`dataset` as single samples, each a tuple of tensors in the order of `specs`, cast to their dtypes."""
    import tensorflow as tf

    element = dataset.element_spec
    if not isinstance(element, tuple) or len(element) != 2:
        raise TagInputError(where, f"elements must be (inputs, labels) pairs; they are {_shown(element)}")
    inputs, label = element
    names = [s.name for s in specs[:-1]]
    if isinstance(inputs, dict):
        missing = [n for n in names if n not in inputs]
        if missing:
            raise TagInputError(where, f"inputs lack {', '.join(map(repr, missing))}; they hold "
                                       f"{', '.join(map(repr, inputs))}")
        pick = lambda x: [x[n] for n in names]  # noqa: E731
        given = [inputs[n] for n in names]
    elif isinstance(inputs, (tuple, list)):
        if len(inputs) != len(names):
            raise TagInputError(where, f"inputs are {len(inputs)} tensors; the model takes {len(names)} "
                                       f"({', '.join(names)})")
        pick, given = list, list(inputs)
    else:
        if len(names) != 1:
            raise TagInputError(where, f"inputs are one tensor; the model takes {len(names)} ({', '.join(names)})")
        pick, given = (lambda x: [x]), [inputs]  # noqa: E731
    given.append(label)
    for tensor, spec in zip(given, specs):
        if not isinstance(tensor, tf.TensorSpec):
            raise TagInputError(where, f"{_field(spec, specs)} is {_shown(tensor)}, not a dense tensor")
    batched = _batched(given, specs, where)
    for tensor, spec in zip(given, specs):
        _check_dtype(tensor.dtype, spec, f"{where}: {_field(spec, specs)}")

    def to_tuple(x, y):
        return tuple(tf.cast(t, s.dtype) for t, s in zip([*pick(x), y], specs))

    mapped = dataset.map(to_tuple, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return mapped.unbatch() if batched else mapped


def _batched(given, specs: list[InputSpec], where: str) -> bool:
    """Whether the elements are batches (one more leading dimension than a sample); shapes must fit either way."""
    states = set()
    for tensor, spec in zip(given, specs):
        shape = tensor.shape
        if shape.rank is None:
            raise TagInputError(where, f"{_field(spec, specs)} has an unknown rank")
        sample = tuple(spec.shape)
        dims = shape.as_list()
        for offset in (0, 1):
            rest = dims[offset:]
            if len(rest) == len(sample) and all(d is None or d == s for d, s in zip(rest, sample)):
                states.add(offset)
                break
        else:
            raise TagInputError(where, f"{_field(spec, specs)} has shape {tuple(dims)}; the model takes {sample} "
                                       f"per sample")
    if len(states) > 1:
        raise TagInputError(where, "some parts of an element are batched and others are single samples")
    return states.pop() == 1


def _check_dtype(dtype, spec: InputSpec, where: str) -> None:
    want = np.dtype(spec.dtype)
    given = np.dtype(dtype.as_numpy_dtype) if dtype.is_numpy_compatible else None
    if given is None or (want.kind == "f") != (given.kind == "f") or (want.kind in "iu") != (given.kind in "iu"):
        raise TagInputError(where, f"has dtype {dtype.name}; the model takes {want}"
                                   + (" (floats: convert and scale it)" if want.kind == "f" else ""))


def _read_through(dataset, specs: list[InputSpec], where: str) -> tuple[int, str]:
    """(rows, content hash) of a dataset read once, checking each element's shape and integer ranges."""
    import tensorflow as tf

    hashes, rows = [hashlib.sha256() for _ in specs], 0
    try:
        for chunk in dataset.batch(HASH_CHUNK).as_numpy_iterator():
            for array, spec, digest in zip(chunk, specs, hashes):
                digest.update(np.ascontiguousarray(_checked_array(array, spec, f"{where}: {_field(spec, specs)}")).data)
            rows += len(chunk[0])
    except tf.errors.OpError as exc:
        raise TagInputError(where, f"reading the dataset failed: {type(exc).__name__}: "
                                   f"{str(exc).splitlines()[0][:300]}") from None
    return rows, _content_hash(hashes, [s.dtype for s in specs], rows)


def _field(spec: InputSpec, specs: list[InputSpec]) -> str:
    return f"labels ({spec.name})" if spec is specs[-1] else f"input {spec.name!r}"


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def ahead(batches: Iterator[list[np.ndarray]], depth: int = 4) -> Iterator[list[np.ndarray]]:
    """`batches`, made by a thread of their own `depth` batches ahead, so that a
    data function's tf.data pipeline overlaps with the step (a session's run lets go of the GIL while the
    step runs)."""
    import queue
    import threading

    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def produce() -> None:
        try:
            for item in batches:
                while not stop.is_set():
                    try:
                        ready.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            ready.put(end)
        except BaseException as exc:  # handed to the consumer, raised there
            ready.put(exc)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        while True:
            item = ready.get()
            if item is end:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
