"""The Celery side of cluster mode (TAG_ENV=cluster): one set of settings for the executor that submits a
run's steps and for the workers that run them (`celery -A tag_pipelines.celery_app worker`).

A worker is a whole machine's worth of work at a time (`--pool solo`, one step), and a step is acknowledged
only once it has finished, so a worker that dies mid-step leaves its message unacknowledged: Redis hands it
to another worker once the visibility timeout has passed. A step longer than that timeout may run twice;
the stages' saves are idempotent (a plan's id is its content's hash), so it lands once either way.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

from tag_core.errors import TagInputError

BROKER_VAR = "TAG_CELERY_BROKER"
VISIBILITY_VAR = "TAG_CELERY_VISIBILITY_S"
# Long enough for a step to profile or plan a large model; a lost worker's step waits this long.
DEFAULT_VISIBILITY_S = 900


def broker_url() -> str:
    url = os.environ.get(BROKER_VAR, "").strip()
    if not url:
        raise TagInputError(BROKER_VAR, "not set; TAG_ENV=cluster needs the Redis broker's URL (source .cluster/env)")
    if not url.startswith(("redis://", "rediss://")):
        raise TagInputError(BROKER_VAR, f"{url!r} is not a redis:// URL")
    return url


def visibility_timeout_s() -> int:
    text = os.environ.get(VISIBILITY_VAR, "").strip()
    try:
        value = int(text) if text else DEFAULT_VISIBILITY_S
    except ValueError:
        value = 0
    if value < 1:
        raise TagInputError(VISIBILITY_VAR, f"must be a whole number of seconds >= 1, got {text!r}")
    return value


def celery_settings() -> dict[str, Any]:
    """Settings both ends share (Celery's lowercase names)."""
    visibility = visibility_timeout_s()
    return {
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "broker_connection_retry_on_startup": True,
        "result_expires": 24 * 3600,
        # Sweep for abandoned messages every few seconds rather than every 100 s (10 s × throttle 10).
        "broker_transport_options": {"visibility_timeout": visibility, "unacked_restore_interval": 5,
                                     "unacked_restore_throttle": 1},
        "result_backend_transport_options": {"visibility_timeout": visibility},
    }


def executor_config() -> dict[str, Any]:
    """The `celery` executor's config: the broker doubles as the result backend."""
    # dagster-celery makes its task again for every step it submits; celery keeps the first, as it should.
    warnings.filterwarnings("ignore", message="Task name 'execute_plan' is already registered")
    url = broker_url()
    return {"broker": url, "backend": url, "config_source": celery_settings()}


def check_broker(url: str, wait_s: float) -> None:
    """Ping the broker, retrying for up to `wait_s`; one line naming it when it never answers."""
    import redis

    began, pause, problem = time.monotonic(), 0.2, ""
    while True:
        try:
            redis.Redis.from_url(url, socket_connect_timeout=min(5.0, max(wait_s, 0.5))).ping()
            return
        except redis.RedisError as exc:
            problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if time.monotonic() - began + pause > wait_s:
            raise TagInputError(BROKER_VAR, f"cannot reach {url} after {wait_s:g} s: {problem}")
        time.sleep(pause)
        pause = min(pause * 2, 2.0)


def make_worker_app():
    from dagster_celery.config import DEFAULT_CONFIG, dict_wrapper
    from dagster_celery.make_app import make_app

    config = executor_config()
    settings = dict_wrapper(dict(DEFAULT_CONFIG, **config["config_source"]))
    return make_app({"broker": config["broker"], "backend": config["backend"], "include": [],
                     "config_source": settings})

