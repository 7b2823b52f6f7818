"""`tag train-gnn --out CKPT`: train the MCTS prior network (AlphaZero-style) and write a checkpoint."""

from __future__ import annotations

import sys

from tag_core.files import output_file

from ._common import non_negative_int, open_store, positive_float, positive_int

# Defaults of the options that --resume may take from the checkpoint instead.
_DEFAULTS = {"topologies": 64, "seed": 0, "episodes": 6, "iterations": 100}


def register(subparsers) -> None:
    parser = subparsers.add_parser("train-gnn", help="train the GNN that gives MCTS its priors (CPU, bounded)")
    parser.add_argument("--out", required=True, metavar="CKPT", help="checkpoint to write (after every generation)")
    parser.add_argument("--models", help="comma-separated model references (default: the six benchmark zoo models); "
                                         "captured first when missing")
    parser.add_argument("--topologies", type=positive_int, help=f"random training topologies: seeds 0..N-1 "
                                                                f"(default {_DEFAULTS['topologies']})")
    parser.add_argument("--minutes", type=positive_float, help="wall-clock budget of this run (default 10 unless "
                                                                "--generations is given)")
    parser.add_argument("--generations", type=positive_int, help="stop after this many generations in all "
                                                                 "(deterministic for a seed)")
    parser.add_argument("--episodes", type=positive_int, help=f"MCTS searches per generation "
                                                              f"(default {_DEFAULTS['episodes']})")
    parser.add_argument("--iterations", type=positive_int, help=f"MCTS iterations per search "
                                                                f"(default {_DEFAULTS['iterations']})")
    parser.add_argument("--resume", metavar="CKPT", help="continue from a checkpoint (its settings unless given)")
    parser.add_argument("--seed", type=non_negative_int, help="training seed (default 0)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def run(args) -> int:
    out = output_file(args.out, "--out")
    from tag_core.capture.models import split_models  # here, not at the top: every `tag` command imports this module
    from tag_core.gnn.checkpoint import load_checkpoint
    from tag_core.gnn.train import TrainConfig, train
    from tag_core.report.plots import training_curve

    resume = load_checkpoint(args.resume, where="--resume") if args.resume else None
    base = dict(resume.training.get("config", {})) if resume is not None else {}
    given = {k: getattr(args, k) for k in ("topologies", "seed", "episodes", "iterations") if getattr(args, k) is not None}
    settings = {**_DEFAULTS, **{k: v for k, v in base.items() if k in TrainConfig.__dataclass_fields__}, **given}
    if args.models is not None:
        settings["models"] = split_models(args.models)
    elif "models" not in settings:
        from tag_core.capture.models import BENCHMARK_MODELS

        settings["models"] = list(BENCHMARK_MODELS)
    settings["generations"] = args.generations
    settings["minutes"] = args.minutes if args.minutes is not None or args.generations else 10.0
    cfg = TrainConfig(**settings)
    sources = load_sources(args, cfg.models, cfg.groups)
    print(f"tag: training on {', '.join(cfg.models)}; topology seeds 0..{cfg.topologies - 1}; "
          + (f"{cfg.minutes:g} min" if cfg.minutes else f"{cfg.generations} generations"), file=sys.stderr)
    digest, training, metrics = train(cfg, sources, out, resume=resume, show_progress=not args.quiet,
                                      log=lambda line: print(line, file=sys.stderr))
    picture = out.with_suffix(".png")
    picture.write_bytes(training_curve(metrics))
    print(f"checkpoint {out} (sha256 {digest[:16]}, {out.stat().st_size / 1e6:.2f} MB): "
          f"{training['generations']} generations, {training['episodes']} searches, {training['examples']} examples, "
          f"{training['wall_s'] / 60:.1f} min")
    print(f"last 5 generations: loss {_f(metrics['loss'])}, top-1 agreement {_f(metrics['top1_before_training'])}, "
          f"best-plan speedup over DP-NCCL {_f(metrics['speedup_vs_dp'])}; curve {picture}")
    return 0


def _f(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def load_sources(args, models: list[str], num_groups: int) -> dict:
    """Captured graphs and profiles for `models` (captured now when missing; no profiles: roofline estimates)."""
    from tag_core import store
    from tag_core.capture.models import resolve_model
    from tag_core.capture.steps import ensure_captured
    from tag_core.gnn.problems import ModelSource

    specs = [resolve_model(m) for m in models]
    conn = open_store(args)
    try:
        loaded = [(m, ensure_captured(conn, spec), store.load_profiles(conn, spec.name)) for m, spec in zip(models, specs)]
    finally:
        conn.close()
    return {m: ModelSource.build(m, graph, profiles, num_groups) for m, graph, profiles in loaded}
