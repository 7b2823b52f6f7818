"""What `tag fidelity` measures again inside the window of its measurement, for the predictions it reports.

On a shared machine a step's speed can move by half within a minute, and so can the runtime's fixed costs:
two calibrations of the same local cluster, minutes apart, put its step launch at 1.28 and 1.88 ms and the
share of transfers compute hides at 49% and 10%. Profiles and a calibration made before the measurement may
have caught another machine than the rounds did. So, while the interleaved measurement waits after each round
(and once after the last), `MeasurementWindow` can profile the model again (--profile-after) and calibrate
this machine's cluster again (--calibrate-after: servers of their own, pinned to the cores of the measurement's,
which idle meanwhile; the waiting measurement holds its client's port). The
report predicts from what was measured in the window: the profiles' rows together, and one calibration fitted
to every sample of the window.

A user who knows none of this is still told: by default (`drift_check`) the model is profiled once more after
the last round, and where a batch size's step moved by more than `DRIFT` from the profile before, `drift()`
says the machine drifted, and `tag fidelity` predicts from the profile after.
"""

from __future__ import annotations

import math
from typing import Callable

from tag_core.cluster.topology import Topology

CALIBRATION_REPEATS = 7  # timed runs per series of a calibration, spread over the window's calibrations
DRIFT = 0.15  # a profiled step this much faster or slower after the measurement than before: the machine drifted


class MeasurementWindow:
    """Called between the rounds (round index) and after the last (None). `profiles` (None until a profile in
    the window: --profile-after's, or the drift check's after the last round): the window's profile rows, runs
    numbered on; `profile_steps`: how fast each profile ran,
    the one before first. `comm()` (None without --calibrate-after): the communication model fitted to every
    calibration sample of the window (call it once the window has closed); `calibrations`: each of the window's
    calibrations' headline terms."""

    def __init__(self, own, before, topology: Topology, profile: bool, calibrate: bool, profile_runs: int,
                 rounds: int, db: str | None, echo: Callable[[str], None], drift_check: bool = False):
        self.own, self.topology, self.rounds, self.db, self.echo = own, topology, rounds, db, echo
        self.profile, self.calibrate, self.drift_check = profile, calibrate, drift_check
        self.columns = list(before.columns)
        self.sizes = sorted(int(b) for b in before.batch_size.unique())
        self.runs = max(1, math.ceil(profile_runs / rounds))
        self.profiles = None
        self.profile_steps = profile_steps(before, "before")
        self.samples: list = []
        self.calibrations: list[dict] = []

    def __call__(self, round_index: int | None = None) -> None:
        when = "after" if round_index is None else f"after round {round_index + 1}"
        if self.profile or (self.drift_check and round_index is None):
            self._profile_again(when, round_index is None)
        if self.calibrate:
            self._calibrate_again(when, round_index is None)

    def _profile_again(self, when: str, last: bool) -> None:
        import pandas as pd

        from tag_core import store
        from tag_core.profile.profiler import profile_model

        self.echo(f"profiling {self.own.name} again at batch sizes {self.sizes}, "
             f"{'after the measurement' if last else when}")
        conn = store.connect(self.db)
        try:
            profile = profile_model(conn, self.own, self.sizes, runs=self.runs, warmup=2, show_progress=False)
        finally:
            conn.close()
        self.profile_steps += profile_steps(profile, when)
        if self.profiles is not None:
            profile = profile.assign(run=profile.run + int(self.profiles.run.max()) + 1)
            profile = pd.concat([self.profiles, profile[self.columns]], ignore_index=True)
        self.profiles = profile[self.columns]

    def _calibrate_again(self, when: str, last: bool) -> None:
        from .calibrate import CalibrationError, CalibrationSettings, calibrate_local
        from .local_cluster import ServerStartError

        self.echo(f"calibrating {self.topology.num_machines} local tasks again, "
                  f"{'after the measurement' if last else when}")
        repeats = max(2, math.ceil(CALIBRATION_REPEATS / self.rounds))
        try:
            calibration, _ = calibrate_local(self.topology.num_machines, CalibrationSettings(repeats=repeats),
                                             progress=False)
        except (CalibrationError, ServerStartError) as exc:  # the window's other calibrations still count
            self.echo(f"warning: the calibration {when} failed: {exc}")
            self.calibrations.append({"calibration": when, "error": str(exc)})
            return
        self.samples += calibration.samples
        self.calibrations.append({"calibration": when, **_headline(calibration)})

    def calibration(self):
        """One calibration fitted to every sample of the window, stored as the topology's newest (the stored
        measured steps name it, and later plans of this snapshot use it); None: no samples, or no fit."""
        from tag_core import store
        from tag_core.cluster.calibration import save_to_store

        from .calibrate import CalibrationError, fit_samples

        if not self.samples:
            return None
        try:
            calibration = fit_samples(self.samples, self.topology.name, self.topology.content_hash(), "local")
        except CalibrationError:
            return None
        conn = store.connect(self.db)
        try:
            save_to_store(conn, calibration)
        finally:
            conn.close()
        return calibration

    def comm(self):
        """The communication model of `calibration()` (None: none)."""
        from tag_core.simulate.comm import CommModel

        calibration = self.calibration()
        return None if calibration is None else CommModel.from_calibration(calibration)

    def drift(self) -> dict | None:
        """The profiled step before against after the measurement, at the batch size where it moved most: whether
        that passes `DRIFT`, and a line saying so (None: not profiled after)."""
        before = {s["batch_size"]: s["step_s"] for s in self.profile_steps if s["profile"] == "before"}
        after = {s["batch_size"]: s["step_s"] for s in self.profile_steps if s["profile"] == "after"}
        both = [b for b in sorted(after) if before.get(b, 0) > 0]
        if not both:
            return None
        batch = max(both, key=lambda b: abs(after[b] / before[b] - 1))
        change = after[batch] / before[batch] - 1
        drifted = abs(change) > DRIFT
        text = (f"the model's step at batch {batch} profiled {before[batch] * 1e3:.3g} ms before the measurement "
                f"and {after[batch] * 1e3:.3g} ms after it ({change:+.0%}): ")
        if drifted:
            text += f"the machine drifted (beyond {DRIFT:.0%}); the predictions are from the profile after"
        else:
            text += f"within {DRIFT:.0%}, no drift"
        return {"batch_size": batch, "before_s": before[batch], "after_s": after[batch], "change": change,
                "threshold": DRIFT, "drifted": drifted, "text": text}

    def report(self) -> dict:
        """The window's part of `tag fidelity --json` (the calibration the predictions used is the report's own)."""
        return {"profile_steps": self.profile_steps if self.profile or self.drift_check else None,
                "calibrations_during": self.calibrations if self.calibrate else None}


def _headline(calibration) -> dict:
    """What moves from one calibration to the next: the step launch by tasks and the share compute hides."""
    from tag_core.simulate.comm import CommModel

    comm = CommModel.from_calibration(calibration)
    return {"hash": calibration.calibration_hash, "step_s_by_tasks": comm.step_s_by_tasks,
            "compute_overlap": comm.compute_overlap}


def profile_steps(frame, when: str) -> list[dict]:
    """Per batch size of a profile (one device type: this machine's): its step, the ops added up."""
    from tag_core.simulate.cost import profiled_steps

    return [{"profile": when, "batch_size": int(b), "step_s": float(us) * 1e-6}
            for (_, b), us in profiled_steps(frame).items()]
