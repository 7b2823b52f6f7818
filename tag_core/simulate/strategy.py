"""Strategy: how each op group is placed and replicated, and how the batch is shared.

- `op_groups[i]`: the group of op i (the planner's METIS groups; one group for all ops is fine).
- per group: `masks[g]`, a placement mask over device groups (= machines), and
  `options[g]`, one of OPTIONS:
    allreduce       replicate on the group's devices, split the batch, AllReduce gradients;
    ps              replicate and split the batch; each variable lives on a parameter server
                    chosen round-robin among the group's devices: workers pull it before use
                    and push gradients to it, the PS applies the update;
    duplicate       a full copy on every device of the group, full batch, no gradient sync;
    model_parallel  the group's ops are split across its devices (`op_devices`, or contiguous
                    chunks of the schedule when not given), full batch.
- `batch_shares[d]`: relative share of the batch on device d. A group's devices are the
  devices of its masked machines with a positive share; inside a group shares are normalised,
  and a split group's become whole rows (batch_rows.py: a device left without a row drops out).
- `fusion_bytes`: gradient buckets for AllReduce (Horovod's tensor fusion); 0 = one per tensor.
- `overlap`: gradient sync may start during the backward pass (False: after all of it, as
  TF's MirroredStrategy does).
- `sfb`: Sufficient Factor Broadcasting, variable name -> the ops of its gradient that every
  replica recomputes on the whole batch from broadcast factors instead of syncing the
  gradient (tag_core.sfb.milp decides them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tag_core.errors import TagInputError
from tag_core.limits import INT64_MAX  # numpy int64 holds indices and sizes

OPTIONS = ("allreduce", "ps", "duplicate", "model_parallel")
FORMAT_VERSION = 1
MAX_OPS = 10_000_000  # far beyond any captured graph; a larger num_ops would only allocate a huge op_groups


@dataclass
class Strategy:
    op_groups: np.ndarray  # int per op
    masks: np.ndarray  # bool (n_groups, n_machines)
    options: list[str]  # per group
    batch_shares: np.ndarray  # float per device
    fusion_bytes: int = 0
    overlap: bool = True
    op_devices: np.ndarray | None = None  # int per op: device for model-parallel ops, -1 = unset
    name: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # free-form metadata kept through JSON
    sfb: dict[str, list[int]] = field(default_factory=dict)  # variable -> ops duplicated for SFB

    def __post_init__(self) -> None:
        self.op_groups = np.asarray(self.op_groups, dtype=np.int64)
        self.masks = np.asarray(self.masks, dtype=bool)
        if self.masks.ndim == 1:
            self.masks = self.masks[None, :]
        self.options = [str(o) for o in self.options]
        self.batch_shares = np.asarray(self.batch_shares, dtype=np.float64)
        if self.op_devices is not None:
            self.op_devices = np.asarray(self.op_devices, dtype=np.int64)
        self.sfb = {str(k): [int(i) for i in v] for k, v in (self.sfb or {}).items()}
        self._check()

    @property
    def num_groups(self) -> int:
        return len(self.options)

    @property
    def options_arr(self) -> np.ndarray:
        """Option of each group as its index in OPTIONS."""
        return np.array([OPTIONS.index(o) for o in self.options], dtype=np.int64)

    @classmethod
    def uniform(
        cls,
        num_ops: int,
        num_machines: int,
        num_devices: int,
        option: str = "allreduce",
        batch_shares: np.ndarray | None = None,
        mask: np.ndarray | None = None,
        **kwargs: Any,
    ) -> "Strategy":
        """One group holding every op."""
        shares = np.ones(num_devices) if batch_shares is None else batch_shares
        mask = np.ones(num_machines, dtype=bool) if mask is None else mask
        return cls(np.zeros(num_ops, dtype=np.int64), np.asarray(mask, dtype=bool)[None, :], [option], shares, **kwargs)

    def _check(self) -> None:
        def need(cond: bool, where: str, problem: str) -> None:
            if not cond:
                raise TagInputError(where, problem)

        need(self.op_groups.ndim == 1, "op_groups", "must be a list of group indices")
        need(self.masks.ndim == 2 and self.masks.shape[0] > 0, "groups", "must hold at least one group")
        need(len(self.options) == self.masks.shape[0], "groups", "every group needs a mask and an option")
        if len(self.op_groups):
            need(self.op_groups.min() >= 0 and self.op_groups.max() < self.num_groups, "op_groups",
                 f"group indices must lie in [0, {self.num_groups})")
        for g, option in enumerate(self.options):
            need(option in OPTIONS, f"groups[{g}].option", f"must be one of {', '.join(OPTIONS)}, got {option!r}")
            need(bool(self.masks[g].any()), f"groups[{g}].mask", "must select at least one machine")
        need(self.batch_shares.ndim == 1 and len(self.batch_shares) > 0, "batch_shares", "must list one share per device")
        need(bool(np.all(np.isfinite(self.batch_shares)) and np.all(self.batch_shares >= 0)), "batch_shares",
             "must be finite and non-negative")
        with np.errstate(over="ignore"):  # an overflow is the error reported below, not a warning
            total = self.batch_shares.sum()
        need(bool(total > 0), "batch_shares", "at least one share must be positive")
        # Shares are normalised by their sum: an infinite sum (two shares of 1e308) would make every share NaN.
        need(bool(np.isfinite(total)), "batch_shares", "must sum to a finite number")
        need(isinstance(self.fusion_bytes, (int, np.integer)) and self.fusion_bytes >= 0, "fusion_bytes",
             "must be a non-negative integer")
        if self.op_devices is not None:
            need(self.op_devices.shape == self.op_groups.shape, "op_devices", "must have one entry per op")

    def validate(self, num_ops: int, num_machines: int, num_devices: int) -> None:
        """Check the shapes against a graph and a topology; TagInputError names the field."""
        if len(self.op_groups) != num_ops:
            raise TagInputError("op_groups", f"has {len(self.op_groups)} entries but the graph has {num_ops} ops")
        if self.masks.shape[1] != num_machines:
            raise TagInputError("groups[0].mask", f"has {self.masks.shape[1]} entries but the topology has {num_machines} machines")
        if len(self.batch_shares) != num_devices:
            raise TagInputError("batch_shares", f"has {len(self.batch_shares)} entries but the topology has {num_devices} devices")
        if self.op_devices is not None and len(self.op_devices) and (self.op_devices.max() >= num_devices or self.op_devices.min() < -1):
            raise TagInputError("op_devices", f"device indices must lie in [-1, {num_devices})")
        for name, ops in self.sfb.items():
            if any(i < 0 or i >= num_ops for i in ops):
                raise TagInputError(f"sfb[{name!r}]", f"op indices must lie in [0, {num_ops})")

    # ---- JSON ----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        one_group = bool(self.num_groups == 1 and not self.op_groups.any())
        data: dict[str, Any] = {
            "version": FORMAT_VERSION,
            "name": self.name,
            "num_ops": int(len(self.op_groups)),
            # One group for every op is common (baselines): then the per-op list is left out.
            "op_groups": None if one_group else self.op_groups.tolist(),
            "groups": [{"mask": [int(b) for b in self.masks[g]], "option": self.options[g]} for g in range(self.num_groups)],
            "batch_shares": [float(s) for s in self.batch_shares],
            "fusion_bytes": int(self.fusion_bytes),
            "overlap": bool(self.overlap),
            "op_devices": None if self.op_devices is None else self.op_devices.tolist(),
        }
        if self.extra:
            data["extra"] = self.extra
        if self.sfb:
            data["sfb"] = {name: list(ops) for name, ops in sorted(self.sfb.items())}
        return data

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Any) -> "Strategy":
        if not isinstance(data, dict):
            raise TagInputError("strategy", "must be a JSON object")
        if isinstance(data.get("strategy"), dict) and not isinstance(data.get("groups"), list):
            data = data["strategy"]  # a plan file: its "groups" is a count, its strategy is embedded
        for key in ("groups", "batch_shares"):
            if key not in data:
                raise TagInputError(key, "missing field")
        version = data.get("version", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise TagInputError("version", f"unsupported strategy format {version!r} (this TAG reads {FORMAT_VERSION})")
        groups = data["groups"]
        if not isinstance(groups, list) or not groups:
            raise TagInputError("groups", "must be a non-empty list")
        masks, options = [], []
        for g, group in enumerate(groups):
            if not isinstance(group, dict):
                raise TagInputError(f"groups[{g}]", "must be an object with mask and option")
            for key in ("mask", "option"):
                if key not in group:
                    raise TagInputError(f"groups[{g}].{key}", "missing field")
            mask = group["mask"]
            if not isinstance(mask, list) or not all(isinstance(b, (bool, int)) and b in (0, 1) for b in mask):
                raise TagInputError(f"groups[{g}].mask", "must be a list of 0/1 per machine")
            masks.append([bool(b) for b in mask])
            options.append(group["option"])
        if len({len(m) for m in masks}) != 1:
            raise TagInputError("groups", "every mask must have one entry per machine")
        shares = data["batch_shares"]
        if not isinstance(shares, list) or not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in shares):
            raise TagInputError("batch_shares", "must be a list of numbers, one per device")
        for d, share in enumerate(shares):  # before numpy: a 400-digit integer does not fit a float
            if not _fits_float(share):
                raise TagInputError(f"batch_shares[{d}]", "must be a finite number (a float holds at most 1.8e308)")
        num_ops = data.get("num_ops")
        op_groups = data.get("op_groups")
        if op_groups is None:
            if not _is_int(num_ops) or not 0 <= num_ops <= MAX_OPS:
                raise TagInputError("num_ops", f"required (an integer in [0, {MAX_OPS}]) when op_groups is null")
            op_groups = [0] * num_ops
        elif not isinstance(op_groups, list) or not all(_is_int(x) for x in op_groups):
            raise TagInputError("op_groups", "must be a list of integers")
        elif num_ops is not None and num_ops != len(op_groups):
            raise TagInputError("num_ops", f"says {num_ops} but op_groups has {len(op_groups)} entries")
        # Ranges are checked here, before numpy's int64 arrays would overflow on a huge integer.
        if not all(0 <= x < len(groups) for x in op_groups):
            raise TagInputError("op_groups", f"group indices must lie in [0, {len(groups)})")
        op_devices = data.get("op_devices")
        if op_devices is not None and (not isinstance(op_devices, list) or not all(_is_int(x) for x in op_devices)):
            raise TagInputError("op_devices", "must be a list of integers or null")
        if op_devices is not None and not all(-1 <= x < len(shares) for x in op_devices):
            raise TagInputError("op_devices", f"device indices must lie in [-1, {len(shares)}) (one per batch share)")
        fusion = data.get("fusion_bytes", 0)
        if not _is_int(fusion) or not 0 <= fusion <= INT64_MAX:
            raise TagInputError("fusion_bytes", f"must be an integer in [0, {INT64_MAX}]")
        overlap = data.get("overlap", True)
        if not isinstance(overlap, bool):
            raise TagInputError("overlap", "must be true or false")
        sfb = data.get("sfb") or {}
        if not isinstance(sfb, dict):
            raise TagInputError("sfb", "must map variable names to lists of op indices")
        for name, ops in sfb.items():
            if not isinstance(ops, list) or not all(_is_int(x) for x in ops):
                raise TagInputError(f"sfb[{name!r}]", "must be a list of op indices")
        extra = data.get("extra")
        extra = {} if extra is None else extra
        if not isinstance(extra, dict):
            raise TagInputError("extra", f"must be a JSON object, got {type(extra).__name__}")
        machines = extra.get("machines")
        if machines is not None and (not isinstance(machines, list) or not all(isinstance(m, str) for m in machines)):
            raise TagInputError("extra.machines", "must be a list of machine names")
        return cls(
            op_groups=np.array(op_groups, dtype=np.int64),
            masks=np.array(masks, dtype=bool),
            options=options,
            batch_shares=np.array(shares, dtype=np.float64),
            fusion_bytes=fusion,
            overlap=overlap,
            op_devices=None if op_devices is None else np.array(op_devices, dtype=np.int64),
            name=str(data.get("name", "")),
            extra=dict(extra),
            sfb=sfb,
        )

    @classmethod
    def from_json(cls, text: str) -> "Strategy":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TagInputError("strategy", f"not valid JSON: {exc}") from None
        except RecursionError:
            raise TagInputError("strategy", "not valid JSON: nested too deeply") from None
        return cls.from_dict(data)

    def check_machines(self, names: list[str], topology: str) -> None:
        """extra.machines, when given, must be the topology's machines in its order: masks are positional."""
        given = self.extra.get("machines")
        if given is None or [str(m).lower() for m in given] == [n.lower() for n in names]:
            return
        known = {n.lower() for n in names}
        unknown = [str(m) for m in given if str(m).lower() not in known]
        if unknown:
            raise TagInputError("extra.machines", f"names machines topology {topology!r} does not have: {', '.join(unknown)}")
        raise TagInputError("extra.machines", f"must list the machines of topology {topology!r} in its order: {', '.join(names)}")

    def key(self) -> bytes:
        """A compact hashable identity (for caches of simulation results)."""
        parts = [self.op_groups.tobytes(), self.masks.tobytes(), "|".join(self.options).encode(),
                 np.round(self.batch_shares, 9).tobytes(), str((self.fusion_bytes, self.overlap)).encode()]
        if self.op_devices is not None:
            parts.append(self.op_devices.tobytes())
        if self.sfb:
            parts.append(repr(sorted(self.sfb.items())).encode())
        return b"#".join(parts)


def _fits_float(value: int | float) -> bool:
    try:
        return bool(np.isfinite(float(value)))
    except OverflowError:
        return False


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
