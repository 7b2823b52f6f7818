"""The demo's runs: one Dagster run per partition, executed in a few long-lived worker processes, with
progress read back from the instance's event log.

A Dagster run materializes one partition (or a range of one partitions definition); the demo's assets
have three (model, topology, model × topology), so its work is one run per partition, all tagged with
one demo id (`tag/demo`). Starting `dagster asset materialize` per partition paid Dagster's and
TensorFlow's imports each time (about 15 s on 2 cores); here each worker imports them once and executes
its runs in-process (`execute_job` of the code location's asset job, reconstructable, so the UI knows
the job). Partitions run side by side, as many as there are workers: the assets compute without the
store and take turns on the DuckDB file only to write (tag_pipelines.resources.open_store).
"""

from __future__ import annotations

import functools
import multiprocessing
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dagster import AssetKey, DagsterEventType, DagsterInstance, MultiPartitionKey, RunsFilter

from tag_pipelines.devserver import ROOT

DEMO_TAG = "tag/demo"
STEP_EVENTS = {DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE}


@dataclass(frozen=True)
class Work:
    """One run: the stages (asset keys, upstream first) of one partition."""

    kind: str  # model | topology | pair
    partition: str  # the partition key as Dagster writes it ("mlp", "testbed", "mlp|testbed")
    stages: tuple[str, ...]
    dimensions: tuple[tuple[str, str], ...] = ()  # (dimension, key) of a multi-partition key

    def tags(self, demo_id: str) -> dict[str, str]:
        tags = {DEMO_TAG: demo_id, "dagster/partition": self.partition}
        tags.update({f"dagster/partition/{dim}": key for dim, key in self.dimensions})
        return tags


def pair_work(model: str, topology: str, stages: tuple[str, ...]) -> Work:
    key = MultiPartitionKey({"model": model, "topology": topology})
    return Work("pair", str(key), stages, (("model", model), ("topology", topology)))


@functools.cache
def _repository():
    """The code location as `dagster asset materialize -m tag_pipelines.definitions` loads it: runs keep a
    Python origin, so the UI can re-execute them."""
    from dagster._core.definitions.reconstruct import ReconstructableRepository

    recon = ReconstructableRepository.for_module("tag_pipelines.definitions", "defs", working_directory=str(ROOT))
    return recon, recon.get_definition()


def run_config(stages: tuple[str, ...], asset_config: dict[str, dict], executor: str) -> dict[str, Any]:
    # The celery executor is the job's own (cluster mode), configured once in tag_pipelines.celery_config.
    execution = {} if executor == "celery" else {"execution": {"config": {executor: {}}}}
    return {
        "ops": {op: {"config": c} for op, c in asset_config.items() if op in stages},
        **execution,
        # The demo prints its own progress from the event log; Dagster's console keeps to warnings.
        "loggers": {"console": {"config": {"log_level": "WARNING"}}},
    }


def execute(work: Work, demo_id: str, asset_config: dict[str, dict], executor: str) -> tuple[str, bool, str]:
    """In a worker: one run of `work`; (run id, success, the failure's one line)."""
    from dagster import execute_job

    recon, repo = _repository()
    keys = [AssetKey.from_user_string(s) for s in work.stages]
    job = repo.get_implicit_job_def_for_assets(keys)  # the implicit asset job these partitions belong to
    with DagsterInstance.get() as instance:
        result = execute_job(recon.get_reconstructable_job(job.name), instance, run_config=run_config(
            work.stages, asset_config, executor), tags=work.tags(demo_id), asset_selection=keys)
        failures = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
        why = failures[0].step_failure_data.error.message.strip().splitlines()[0] if failures else ""
        why = why.split(": ", 1)[1] if why.startswith("dagster.") and ": " in why else why  # Failure's own words
        return result.run_id, result.success, why


@dataclass
class Progress:
    """Prints each stage of each run once, as the instance's event log records it."""

    instance: DagsterInstance
    demo_id: str
    started: float = field(default_factory=time.monotonic)
    seen: set = field(default_factory=set)
    step_started: dict = field(default_factory=dict)
    finished: set = field(default_factory=set)

    def poll(self) -> None:
        records = self.instance.get_run_records(RunsFilter(tags={DEMO_TAG: self.demo_id}))
        for record in sorted(records, key=lambda r: r.create_timestamp):
            run = record.dagster_run
            if run.run_id in self.finished:
                continue
            if run.is_finished:  # read its log once more, then never again
                self.finished.add(run.run_id)
            partition = run.tags.get("dagster/partition", "")
            for entry in self.instance.all_logs(run.run_id, of_type=STEP_EVENTS):
                mark = (run.run_id, entry.step_key, entry.dagster_event_type)  # each once per run
                if mark in self.seen:
                    continue
                self.seen.add(mark)
                self._print(entry, partition, run.run_id)

    def _print(self, entry, partition: str, run_id: str) -> None:
        at = f"{time.monotonic() - self.started:6.0f} s"
        step = (run_id, entry.step_key)
        if entry.dagster_event_type == DagsterEventType.STEP_START:
            self.step_started[step] = entry.timestamp
            print(f"{at}  start  {entry.step_key} [{partition}]", flush=True)
            return
        took = entry.timestamp - self.step_started.get(step, entry.timestamp)
        verdict = "done  " if entry.dagster_event_type == DagsterEventType.STEP_SUCCESS else "FAILED"
        print(f"{at}  {verdict} {entry.step_key} [{partition}] in {took:.1f} s (run {run_id[:8]})", flush=True)


def run_all(models: list[str], topologies: list[str], stages: dict[str, tuple[str, ...]], demo_id: str,
            asset_config: dict[str, dict], workers: int, executor: str) -> list[tuple]:
    """Every partition's run, `workers` at a time (the workers inherit os.environ: DAGSTER_HOME, TAG_HOME); a model × topology run starts once its model's and its
    topology's runs succeeded. Returns (work, run id, success, why) per run, skipped ones with run id None."""
    pending_pairs = {(m, t) for m in models for t in topologies}
    done: dict[tuple[str, str], bool] = {}
    results: list[tuple] = []
    running: dict[Future, Work] = {}
    instance = DagsterInstance.get()
    progress = Progress(instance, demo_id)
    context = multiprocessing.get_context("spawn")  # never fork a process that may hold TF or DuckDB
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        def submit(work: Work) -> None:
            running[pool.submit(execute, work, demo_id, asset_config, executor)] = work

        # Topologies first: they take seconds, and every model × topology run waits for them.
        for topology in topologies:
            submit(Work("topology", topology, stages["topology"]))
        for model in models:
            submit(Work("model", model, stages["model"]))
        while running:
            time.sleep(1.0)
            progress.poll()
            for future in [f for f in running if f.done()]:
                work = running.pop(future)
                run_id, ok, why = future.result()
                results.append((work, run_id, ok, why))
                done[(work.kind, work.partition)] = ok
            for model, topology in sorted(pending_pairs):
                ready = [done.get(("model", model)), done.get(("topology", topology))]
                if None in ready:
                    continue
                pending_pairs.discard((model, topology))
                if all(ready):
                    submit(pair_work(model, topology, stages["pair"]))
                else:
                    results.append((pair_work(model, topology, stages["pair"]), None, False, "upstream failed"))
        progress.poll()
    return results
