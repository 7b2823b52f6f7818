"""`tag train MODEL (--plan plan.json | --topology FILE --strategy NAME) --data DATA --out RUN_DIR`: train the
model with its plan on real data, with checkpoints, resume and the trained Keras model out."""

from __future__ import annotations

import sys

from ._common import (add_model_timeout, add_plan_source, non_negative_int32, positive_float, positive_int,
                      positive_int32, print_json)


def register(subparsers) -> None:
    from tag_core.train.checkpoints import KEEP
    from tag_core.train.run import CHECKPOINT_EVERY, STEP_TIMEOUT_S

    parser = subparsers.add_parser(
        "train", help="train the model with a plan on real data: checkpoints, resume, a Keras model out",
        description="Emit the plan into RUN_DIR/graph and train on DATA with it on TF's distributed runtime "
                    "(local servers, or one task of --cluster), as `tag run` runs a graph. Writes checkpoints keyed "
                    "by the model's variable paths, TensorBoard logs under RUN_DIR/logs and RUN_DIR/model.keras, "
                    "and records the run in the store's training_runs table.")
    add_plan_source(parser)
    parser.add_argument("--data", required=True,
                        help="training data: an .npz file with one array per model input, named as the input, and "
                             "`labels`; or path/to/file.py:function returning a tf.data.Dataset of (inputs, labels)")
    parser.add_argument("--validation-data", metavar="DATA", help="data evaluated at each epoch's end (as --data)")
    parser.add_argument("--out", required=True, help="the run folder (new or empty, or an earlier run's with --resume)")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=positive_int, help="train until this many epochs are done (default 1)")
    length.add_argument("--steps", type=positive_int, help="train until this many steps are done")
    parser.add_argument("--batch-size", type=positive_int32, help="global batch with --strategy (default: the model's)")
    parser.add_argument("--checkpoint-every", type=positive_int, default=CHECKPOINT_EVERY, metavar="K",
                        help=f"write a checkpoint every K steps (default {CHECKPOINT_EVERY}), and at each epoch's end "
                             f"and the end")
    parser.add_argument("--keep", type=positive_int, default=KEEP, help=f"checkpoints kept (default {KEEP})")
    parser.add_argument("--resume", action="store_true",
                        help="go on from the run folder's last complete checkpoint: variables, optimizer state and "
                             "data position; the plan may differ from the one it was saved under")
    parser.add_argument("--seed", type=non_negative_int32, default=0, help="seed of the data's shuffling (default 0)")
    parser.add_argument("--device-kind", choices=("gpu", "cpu"),
                        help="GPU devices (default with --cluster) or logical CPU devices (default here)")
    parser.add_argument("--servers", choices=("auto", "direct", "pinned", "shared"), default="auto",
                        help="where local tasks serve, as for `tag run`; direct: no server, the trainer's own session "
                             "(auto's choice where every op lies on one CPU device of task 0)")
    parser.add_argument("--step-timeout", type=positive_float, default=STEP_TIMEOUT_S, metavar="SECONDS",
                        help=f"seconds a step may take before the run stops, naming what it waits for (default "
                             f"{STEP_TIMEOUT_S:g}; the first step gets 300 s more)")
    parser.add_argument("--cluster", help="cluster.json of a real cluster: run one task of it instead of local servers")
    parser.add_argument("--task-index", type=int, default=0,
                        help="this machine's task in --cluster (default 0, the client; others serve until stopped)")
    parser.add_argument("--json", action="store_true", help="print the run's record as JSON")
    add_model_timeout(parser, "--model-timeout")
    parser.set_defaults(run=run)


def run(args) -> int:
    from tag_core.capture.models import resolve_model
    from tag_core.errors import TagInputError
    from tag_core.files import output_folder
    from tag_core.train.run import train

    from ._common import open_store, read_plan_source
    from .emit import _profiles

    if args.strategy and not args.topology:
        raise TagInputError("--topology", "is required with --strategy")
    if args.plan and args.batch_size is not None:
        raise TagInputError("--batch-size", "applies with --strategy; a plan has its own global batch")
    out = output_folder(args.out, "--out")
    open_store(args).close()  # a store that cannot be opened fails now, not after the training
    plan, strategy, topology, check = read_plan_source(args)
    spec = resolve_model(args.model, None, args.model_timeout)
    check(spec.name)
    result = train(spec, out, args.data, plan=plan, strategy=None if plan is not None else strategy,
                   topology=topology, batch_size=args.batch_size,
                   validation=args.validation_data, steps=args.steps, epochs=args.epochs,
                   checkpoint_every=args.checkpoint_every, keep=args.keep, resume=args.resume, seed=args.seed,
                   device_kind=args.device_kind, cluster=args.cluster, task_index=args.task_index,
                   servers=args.servers, step_timeout=args.step_timeout, show_progress=not args.json and
                   sys.stderr.isatty(), echo=(lambda line: None) if args.json else None,
                   profiles=_profiles(args, spec.name))
    if result.row is not None:
        from tag_core import store

        conn = open_store(args)
        try:
            store.save_training_run(conn, result.row)
        finally:
            conn.close()
    if args.json:
        print_json({"ok": result.ok, "error": result.error, "servers": result.servers, "run": result.row})
    elif result.row is not None:
        print(f"recorded run {result.row['run_id']} in training_runs ({result.wall_s:.1f} s in all)")
    if result.error and args.json:
        print(f"tag: {result.error}", file=sys.stderr)
    return result.exit_code
