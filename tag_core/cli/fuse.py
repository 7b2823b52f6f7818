"""`tag fuse MODEL`: plan kernel fusion of memory-intensive ops and, optionally, measure it."""

from __future__ import annotations

from ._common import add_model_timeout, open_store, positive_int, positive_int32, print_json


def register(subparsers) -> None:
    parser = subparsers.add_parser("fuse", help="plan FusionStitching-style fusion of memory-intensive ops")
    parser.add_argument("model", help="zoo name or path/to/file.py:function")
    parser.add_argument("--batch-size", type=positive_int32, help="global batch size (default: the model's)")
    parser.add_argument("--gpu", default="V100-32GB", help="catalog GPU the plan is scored for (default V100-32GB)")
    parser.add_argument("--tune", action="store_true",
                        help="time every pattern for real and keep the winners, then keep those only if the whole "
                             "step gets faster with them (else fewer, or none); the tuned plan is stored")
    parser.add_argument("--measure", action="store_true",
                        help="tune, then time the step under no XLA, auto-clustering, jit_compile and TAG's plan")
    parser.add_argument("--no-regions", dest="regions", action="store_false",
                        help="tune fused patterns only: no compiled regions (XLA programs that also hold compute "
                             "ops, as library calls)")
    parser.add_argument("--steps", type=positive_int, default=10, help="timed steps per mode (default 10)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    add_model_timeout(parser)
    parser.set_defaults(run=run)


def run(args) -> int:
    from tag_core import store
    from tag_core.capture.models import resolve_model
    from tag_core.capture.steps import ensure_captured
    from tag_core.cluster.gpu_catalog import lookup_gpu
    from tag_core.fusion.fuse import fuse_model

    spec = resolve_model(args.model, args.batch_size, timeout=args.model_timeout)
    gpu = lookup_gpu(args.gpu, "--gpu")
    conn = open_store(args)
    try:
        graph = ensure_captured(conn, spec)
        step_file = store.captured_model(conn, spec.name)["step_file"]
    finally:
        conn.close()
    plan = fuse_model(spec, graph, step_file, gpu, tune=args.tune or args.measure, measure=args.measure,
                      steps=args.steps, progress=not args.json, regions=args.regions)
    data = plan.to_json()
    if args.tune or args.measure:  # a tuned plan is what `tag plan --fusion` and `tag emit --fusion` should use
        conn = open_store(args)
        try:
            store.save_fusion_plan(conn, spec.name, graph.content_hash(), data)
        finally:
            conn.close()
    if args.json:
        print_json(data)
        return 0
    check = plan.measured.get("step_check")
    if check:
        def said(v: dict) -> str:
            if "ratio" not in v:
                return "failed to compile"
            low, high = v["ratio_interval"]
            return f"x{v['ratio']:.3f} ({low:.3f}-{high:.3f})"

        tried = ", ".join(f"{_variant(v)} {said(v)}" for v in check["variants"])
        print(f"step check against the plain step ({check['plain_ms']:.1f} ms, at least {check['rounds']} rounds each): {tried}; "
              f"kept {_variant({'patterns': check['kept_patterns'], 'regions': check.get('kept_regions', 0)})}")
    print(f"{spec.name}: {len(plan.patterns)} patterns fuse {plan.ops_fused} ops; "
          f"kernels {plan.kernels_before} -> {plan.kernels_after} (planned); "
          f"estimated saving on {plan.reference_gpu}: {plan.saved_s * 1e3:.2f} ms/step")
    for k, pattern in enumerate(plan.patterns[:10]):
        print(f"  fusion_{k}: {len(pattern)} ops, {pattern[0]} .. {pattern[-1]}")
    if len(plan.patterns) > 10:
        print(f"  ... {len(plan.patterns) - 10} more (use --json)")
    if plan.regions:
        from tag_core.fusion.regions import LIBRARY_SLOWDOWN

        print(f"compiled by XLA as {len(plan.regions)} region(s) of {sum(map(len, plan.regions))} ops, compute ops "
              f"as library calls ({plan.measured.get('library_calls_outside', 0)} of "
              f"{plan.measured.get('library_calls_timed', 0)} left out: XLA ran them over {LIBRARY_SLOWDOWN:g}x slower)")
    if args.tune or args.measure:
        print("stored as this model's fusion plan (used by `tag plan --fusion` and `tag emit --fusion`)")
    if "step_ms" in plan.measured:
        print("median step time and kernels per step, measured here:")
        for mode, ms in plan.measured["step_ms"].items():
            kernels = plan.measured["kernels_per_step"][mode]
            print(f"  {mode:<12} {ms:9.2f} ms   {kernels if kernels is not None else '-':>6} kernels")
    return 0


def _variant(v: dict) -> str:
    return f"{v['patterns']} patterns" + (f" in {v['regions']} region(s)" if v.get("regions") else "")
