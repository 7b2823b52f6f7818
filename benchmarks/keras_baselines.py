"""Keras `fit` throughput on this machine's two cores, for benchmarks/train.py: one device, and under each
tf.distribute strategy over the same two cores that `tag calibrate --local 2` makes its two pinned tasks of.

    keras_throughput(model, data, strategy, steps=300, warmup=20) -> {"samples_per_s", "median_step_s", ...}

Every strategy runs in child processes of its own (a process holds one strategy), with Keras' defaults
(`compile` picks XLA where the model supports it), on the batches `tag train` makes of the same .npz
(tag_core.train.data), at the model's global batch:

- keras_single: one process pinned to core 0 with one compute thread, as one task of the local cluster;
- keras_two_cores: one process on both cores with TF's default threads (what plain Keras gets here);
- mirrored: MirroredStrategy over two logical CPU devices of one process on both cores;
- multi_worker_mirrored: MultiWorkerMirroredStrategy over two worker processes, each pinned to its core
  (TF_CONFIG on loopback, the workers in tag's loopback-only network namespace);
- parameter_server: ParameterServerStrategy with a coordinator, two pinned workers and a parameter server.

Keras 3 `fit` fails under the last two (keras-team/keras#20585 for MultiWorkerMirroredStrategy; it has no
ClusterCoordinator for ParameterServerStrategy), so each also runs as the custom loop TF's guides give
(`*_loop`): a tf.function step under `strategy.run`, scheduled by a ClusterCoordinator for the latter.

Step times come from a callback at each batch's end on worker 0; the rate is the global batch over the
median step after `warmup` steps. A strategy that Keras or TF refuses comes back as {"refused": its error}.
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ("keras_single", "keras_two_cores", "mirrored", "multi_worker_mirrored", "multi_worker_mirrored_loop",
              "parameter_server", "parameter_server_loop")
TIMEOUT_S = 900.0


def keras_throughput(model: str, data: str, strategy: str, steps: int = 300, warmup: int = 20,
                     timeout: float = TIMEOUT_S) -> dict:
    """Samples/s of Keras `fit` of `model` on the .npz `data` under `strategy` (see the module docstring)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: {strategy!r} is not one of {', '.join(STRATEGIES)}")
    from tag_core.runtime.loopback import child_environment, loopback_namespace

    with loopback_namespace():
        env = {**os.environ, **child_environment(), "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT)}
        roles = _roles(strategy)
        cluster = _cluster(roles)
        processes = []
        for role, index, cores, threads in roles:
            task_env = dict(env)
            if cluster:
                task_env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": role, "index": index}})
            argv = [sys.executable, __file__, json.dumps({"model": model, "data": data, "strategy": strategy,
                                                          "steps": steps, "warmup": warmup, "role": role,
                                                          "index": index, "cores": cores, "threads": threads})]
            processes.append(subprocess.Popen(argv, env=task_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True, cwd=ROOT))
        try:
            reports = [_report(processes[0], timeout)]
            if strategy.startswith("parameter_server"):  # its workers and parameter server serve until stopped
                for p in processes[1:]:
                    p.kill()
            reports += [_report(p, timeout) for p in processes[1:]]
        finally:
            for p in processes:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    measured = next((r for r in reports if "samples_per_s" in r or "refused" in r), None)
    if measured is None:
        failed = next((r["failed"] for r in reports if "failed" in r), "no process reported")
        return {"failed": failed}
    rss = [r["peak_rss_mib"] for r in reports if "peak_rss_mib" in r]
    return {**measured, "peak_rss_mib": max(rss) if rss else None, "processes": len(processes)}


def _roles(strategy: str) -> list[tuple[str, int, list[int] | None, int | None]]:
    """(role, index, cores, compute threads) of each process; the first one measures."""
    if strategy == "keras_single":
        return [("single", 0, [0], 1)]
    if strategy in ("keras_two_cores", "mirrored"):
        return [("single", 0, [0, 1], None)]
    if strategy.startswith("multi_worker_mirrored"):
        return [("worker", 0, [0], 1), ("worker", 1, [1], 1)]
    return [("chief", 0, None, None), ("worker", 0, [0], 1), ("worker", 1, [1], 1), ("ps", 0, None, None)]


def _cluster(roles) -> dict[str, list[str]]:
    if len(roles) == 1:
        return {}
    ports = random.Random().sample(range(20000, 60000), len(roles))  # a fresh namespace: every port is free
    cluster: dict[str, list[str]] = {}
    for (role, _, _, _), port in zip(roles, ports):
        cluster.setdefault(role, []).append(f"127.0.0.1:{port}")
    return cluster


def _report(process: subprocess.Popen, timeout: float) -> dict:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        return {"failed": f"timed out after {timeout:.0f} s: {err.strip().splitlines()[-1:] or ''}"}
    line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        if process.returncode in (-9, -15):  # a server stopped by us once the measuring process was done
            return {}
        return {"failed": f"exit {process.returncode}: {' | '.join(err.strip().splitlines()[-3:])}"}
    return json.loads(line[len("RESULT "):])


# ---- the child ------------------------------------------------------------------------------------------


def child(job: dict) -> dict:
    import tag_core.runtime  # noqa: F401  (joins the loopback namespace before any thread starts)
    from tag_core.profile.timing import pin

    pin(job["cores"], job["threads"] or 0)
    import tensorflow as tf

    if job["threads"]:
        tf.config.threading.set_intra_op_parallelism_threads(job["threads"])
        tf.config.threading.set_inter_op_parallelism_threads(job["threads"] + 1)
    if job["role"] in ("worker", "ps") and job["strategy"].startswith("parameter_server"):
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        server = tf.distribute.Server(resolver.cluster_spec(), job_name=job["role"], task_index=job["index"],
                                      protocol="grpc", start=True)
        server.join()
    try:
        strategy = _strategy(tf, job["strategy"])
    except Exception as exc:  # noqa: BLE001  (TF's refusal is the figure)
        return {"refused": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    return _fit(tf, strategy, job)


def _strategy(tf, name: str):
    if name == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    if name.startswith("multi_worker_mirrored"):
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name.startswith("parameter_server"):
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.ParameterServerStrategy(resolver)
    return tf.distribute.get_strategy()


def _fit(tf, strategy, job: dict) -> dict:
    import keras

    from tag_core.capture import resolve_model
    from tag_core.train.data import load_data

    spec = resolve_model(job["model"])
    batch = spec.batch_size
    training = load_data(job["data"], spec, batch)
    inputs = len(training.specs) - 1

    def split(*tensors):
        x = tensors[0] if inputs == 1 else tuple(tensors[:inputs])
        return x, tensors[inputs]

    options = tf.data.Options()  # each worker takes its share of every global batch
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = training.epoch(0, 0, batch).repeat().map(split).with_options(options)
    ends: list[float] = []
    keras.utils.set_random_seed(0)
    total = job["warmup"] + job["steps"]
    loop = job["strategy"].endswith("_loop")
    try:
        with strategy.scope():
            net = spec.build()
            optimizer = spec.make_optimizer()
            net.compile(optimizer=optimizer, loss=spec.loss)
        started = time.perf_counter()
        if job["strategy"] == "parameter_server_loop":
            _coordinated_loop(tf, strategy, net, optimizer, keras.losses.get(spec.loss),
                              lambda: training.epoch(0, 0, batch).repeat().map(split), job["warmup"], total, ends)
        elif loop:
            _custom_loop(tf, strategy, net, optimizer, keras.losses.get(spec.loss), dataset, total, ends)
        else:
            class StepTimes(keras.callbacks.Callback):
                def on_train_batch_end(self, batch_index, logs=None):
                    ends.append(time.perf_counter())

            net.fit(dataset, epochs=1, steps_per_epoch=total, verbose=0, callbacks=[StepTimes()])
    except Exception as exc:  # noqa: BLE001  (Keras' refusal is the figure)
        return {"refused": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"}
    asynchronous = job["strategy"] == "parameter_server_loop"  # only the mean of its steps is known
    measured = ends[-1] - ends[0 if asynchronous else job["warmup"]]
    steps = [measured / job["steps"]] if asynchronous else \
        sorted(b - a for a, b in zip(ends[job["warmup"]:], ends[job["warmup"] + 1:]))
    median = steps[len(steps) // 2]
    how = "a tf.function step under strategy.run" if loop else f"XLA {'on' if net.jit_compile else 'off'}"
    return {"samples_per_s": batch / median, "median_step_s": median, "steps": job["steps"],
            "mean_samples_per_s": batch * job["steps"] / measured,
            "fit_wall_s": time.perf_counter() - started,
            "note": "asynchronous steps scheduled on 2 workers, variables on 1 parameter server" if asynchronous
            else f"{how}, {strategy.num_replicas_in_sync} replica(s)"}


def _custom_loop(tf, strategy, net, optimizer, loss, dataset, total: int, ends: list[float]) -> None:
    """The training loop TF's guides give where `fit` fails: each replica's mean loss over the number of
    replicas (the optimizer sums the replicas' gradients), one step per tf.function call."""
    replicas = strategy.num_replicas_in_sync
    batches = iter(strategy.experimental_distribute_dataset(dataset))

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            value = tf.reduce_mean(loss(y, net(x, training=True))) / replicas
        optimizer.apply_gradients(zip(tape.gradient(value, net.trainable_variables), net.trainable_variables))
        return value

    @tf.function
    def step(iterator):
        x, y = next(iterator)
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None)

    for _ in range(total):
        step(batches).numpy()
        ends.append(time.perf_counter())


def _coordinated_loop(tf, strategy, net, optimizer, loss, make_dataset, warmup: int, total: int,
                      ends: list[float]) -> None:
    """TF's guide for ParameterServerStrategy without `fit`: a ClusterCoordinator schedules whole steps of the
    global batch on whichever worker is free (asynchronous updates of the variables on the parameter server);
    `ends` gets the times at which the warm-up and then every step were done."""
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    batches = iter(coordinator.create_per_worker_dataset(make_dataset))

    @tf.function
    def step(iterator):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                value = tf.reduce_mean(loss(y, net(x, training=True)))
            optimizer.apply_gradients(zip(tape.gradient(value, net.trainable_variables), net.trainable_variables))
            return value

        x, y = next(iterator)
        return strategy.run(replica_step, args=(x, y))

    for _ in range(warmup):
        coordinator.schedule(step, args=(batches,))
    coordinator.join()
    ends.append(time.perf_counter())
    for _ in range(total - warmup):
        coordinator.schedule(step, args=(batches,))
    coordinator.join()
    ends.append(time.perf_counter())


def main() -> None:
    job = json.loads(sys.argv[1])
    try:
        result = child(job)
    finally:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if job["role"] in ("single", "chief") or job["index"] == 0:
        print("RESULT " + json.dumps({**result, "peak_rss_mib": rss}), flush=True)
    else:
        print("RESULT " + json.dumps({"peak_rss_mib": rss}), flush=True)


if __name__ == "__main__":
    main()
