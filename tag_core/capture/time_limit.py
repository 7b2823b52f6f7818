"""Time limits on a model's own code: importing its file, calling its function, building it, tracing a step.

In the main thread an interval timer (SIGALRM) interrupts the code past its limit and `time_limit` raises
a TagInputError naming what ran. The alarm's handler runs between two bytecodes of the main thread, so:

- a Python loop (`while True: pass`), `time.sleep`, a lock or a blocking read stop within the limit
  (a system call interrupted by the signal returns to the interpreter, which raises);
- code inside a C extension that never returns to the interpreter (a native loop) runs on until it
  returns: the limit cannot cut it. Such a hang needs the whole process bounded (`timeout(1)`).

Signals reach only the main thread. Elsewhere (a Dagster asset run in a thread) `time_limit` bounds
nothing, and `resolve_model` first loads a user's file in a child process, which it kills past the limit
(see load_check.py). A timer set before (pytest-timeout's) is kept: it fires at its own time.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from tag_core.errors import TagInputError
from tag_core.limits import MODEL_TIMEOUT_S

ENV = "TAG_MODEL_TIMEOUT"
# Longer limits are armed at this: setitimer and select overflow near 1e9 s, and no load runs for months.
LONGEST_S = 1e7
# After a limit passed, the alarm repeats this often, in case the model's code swallowed the first one.
REPEAT_S = 1.0


def model_timeout(seconds: float | None = None) -> float:
    """`seconds`, else $TAG_MODEL_TIMEOUT, else MODEL_TIMEOUT_S; TagInputError unless a positive number."""
    where = "timeout"
    if seconds is None:
        text = os.environ.get(ENV, "").strip()
        if not text:
            return MODEL_TIMEOUT_S
        where = ENV
        try:
            seconds = float(text)
        except ValueError:
            seconds = text
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < math.inf:
        raise TagInputError(where, f"must be a positive number of seconds, got {seconds!r}")
    return float(seconds)


def can_interrupt() -> bool:
    """Whether `time_limit` can stop code running in this thread."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


class _Expired(BaseException):
    """The alarm. Not an Exception: `except Exception` in a model's code must not swallow it."""


@dataclass
class _Armed:
    seconds: float  # the outermost limit: nested ones run under its timer
    ends_at: float  # time.monotonic() when it passes
    handler: Any  # the SIGALRM handler before it
    other_timer_at: float | None  # time.monotonic() when a timer set before it is due


_armed: _Armed | None = None


def _alarm(signum, frame) -> None:
    armed = _armed
    if armed is not None and armed.other_timer_at is not None and time.monotonic() >= armed.other_timer_at:
        armed.other_timer_at = None
        if callable(armed.handler):  # the earlier timer's turn (pytest-timeout failing a test), then ours
            armed.handler(signum, frame)
            signal.setitimer(signal.ITIMER_REAL, max(armed.ends_at - time.monotonic(), 1e-3), REPEAT_S)
            return
    raise _Expired


class ModelTimeout(TagInputError):
    """A model's code ran past its time limit."""


def _timed_out(what: str, seconds: float) -> ModelTimeout:
    return ModelTimeout("model", f"{what} did not finish within the model timeout of {seconds:g} s")


@contextmanager
def time_limit(seconds: float, what: str) -> Iterator[None]:
    """Run the body for at most `seconds` (main thread only, see above); past that, a ModelTimeout
    (a TagInputError) "model: <what> did not finish within the model timeout of <seconds> s". `what` names the file and
    function. A limit inside another runs under the outer one's timer and names its own `what`."""
    global _armed
    if _armed is not None or not can_interrupt():
        outer = _armed
        try:
            yield
        except _Expired:
            if outer is None:
                raise
            raise _timed_out(what, outer.seconds) from None
        return
    other, _ = signal.getitimer(signal.ITIMER_REAL)
    now = time.monotonic()
    handler = signal.getsignal(signal.SIGALRM)
    _armed = _Armed(seconds, now + min(seconds, LONGEST_S), handler, now + other if other > 0 else None)
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, min(seconds, other or math.inf, LONGEST_S), REPEAT_S)
    expired = False
    try:
        yield
    except _Expired:
        expired = True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler if handler is not None else signal.SIG_DFL)
        due = _armed.other_timer_at
        _armed = None
        if due is not None:  # give the earlier timer back what is left of it
            signal.setitimer(signal.ITIMER_REAL, max(due - time.monotonic(), 1e-3))
    if expired:
        raise _timed_out(what, seconds)
