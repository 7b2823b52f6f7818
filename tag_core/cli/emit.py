"""`tag emit MODEL (--plan plan.json | --topology FILE --strategy NAME) --out DIR`: write the distributed graph."""

from __future__ import annotations

from ._common import add_model_timeout, add_plan_source, positive_int32, print_json, read_plan_source


def register(subparsers) -> None:
    parser = subparsers.add_parser("emit", help="emit the distributed TF training graph of a plan or strategy")
    add_plan_source(parser)
    parser.add_argument("--out", required=True, help="folder to write (must not exist unless --force)")
    parser.add_argument("--device-kind", choices=("gpu", "cpu"), default="gpu",
                        help="GPU devices (a real cluster) or logical CPU devices (to run here); default gpu")
    parser.add_argument("--batch-size", type=positive_int32,
                        help="global batch (default: the plan's, else the model's)")
    parser.add_argument("--fusion", nargs="?", const="stored", metavar="FUSION_JSON",
                        help="mark TAG's fusion plan in the emitted graph: each copy of each fused pattern becomes "
                             "one XLA cluster, each region on a device one must-compile call. Alone: the stored "
                             "plan of this graph (the fusion_plan asset's), else a fresh untuned one; with a file: "
                             "a plan from `tag fuse --json`")
    parser.add_argument("--force", action="store_true", help="replace an existing --out folder")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_model_timeout(parser)
    parser.set_defaults(run=run)


def _profiles(args, model: str):
    """Stored op profiles, when there is a store: model-parallel chunks then match the simulator's."""
    from tag_core import store

    conn = store.connect_if_present(args.db)  # none, or busy: chunking falls back to the roofline estimate
    if conn is None:
        return None
    try:
        profiles = store.load_profiles(conn, model)
    finally:
        conn.close()
    return None if profiles.empty else profiles


def _communication(args, topology):
    """(CommModel, why uncalibrated) of the store's calibration of this topology snapshot (comm_for)."""
    from tag_core import store
    from tag_core.simulate.comm import CommModel, comm_for

    conn = store.connect_if_present(args.db)
    if conn is None:
        return CommModel(), f"no store to read at {store.location(args.db)[0]}: the cost model's defaults"
    try:
        return comm_for(conn, topology)
    finally:
        conn.close()


def _fusion(args, model: str):
    """A function of the captured graph and step giving the fusion plan to mark, or None."""
    from tag_core.errors import TagInputError
    from tag_core.fusion.patterns import FusionPlan, plan_fusion

    if args.fusion is None:
        return None
    given = None
    if args.fusion != "stored":
        from tag_core.files import input_file, read_json

        path = input_file(args.fusion, "--fusion")
        data = read_json(path, "--fusion")
        try:
            given = FusionPlan.from_json(data)
        except TagInputError as exc:
            raise TagInputError(f"--fusion {path}: {exc.where}", exc.problem) from None
        if given.model != model:
            raise TagInputError("--fusion", f"{args.fusion} is a fusion plan for {given.model!r}, not {model!r}")

    def fusion_plan(graph, step):
        plan = given if given is not None else _stored_fusion(args, model, graph.content_hash())
        if plan is None:
            return plan_fusion(graph, step.graph_def)
        nodes = {node.name for node in step.graph_def.node}  # regions may hold plumbing the OpGraph leaves out
        missing = [name for pattern in plan.patterns for name in pattern if name not in graph.index]
        missing += [name for region in plan.regions for name in region if name not in nodes]
        if missing:
            raise TagInputError("--fusion", f"the fusion plan names ops the captured graph does not have "
                                            f"({', '.join(missing[:3])}); run `tag fuse` again")
        return plan

    return fusion_plan


def _stored_fusion(args, model: str, graph_hash: str):
    from tag_core import store
    from tag_core.fusion.patterns import FusionPlan

    conn = store.connect_if_present(args.db)  # none, or busy: plan afresh
    if conn is None:
        return None
    try:
        stored = store.load_fusion_plan(conn, model, graph_hash)
    finally:
        conn.close()
    return None if stored is None else FusionPlan.from_json(stored)


def run(args) -> int:
    from tag_core.capture.models import resolve_model
    from tag_core.emit.emitter import emit
    from tag_core.emit.folder import write_emission
    from tag_core.emit.prediction import predict_emission
    from tag_core.errors import TagInputError
    from tag_core.files import output_folder

    if args.strategy and not args.topology:
        raise TagInputError("--topology", "is required with --strategy")
    out = output_folder(args.out, "--out")
    if out.exists() and not args.force:
        raise TagInputError("--out", f"{out} exists; pass --force to replace it")
    # A plan or strategy file is checked before the (slow) tracing, as simulate and sfb check theirs.
    plan, strategy, topology, check = read_plan_source(args)
    batch = args.batch_size
    # A plan's graph hash is of the step at the model's own batch: keep it, the plan says its batch.
    spec = resolve_model(args.model, None if plan is not None else batch, args.model_timeout)
    check(spec.name)
    if plan is not None and batch is not None and plan.get("batch_size") not in (None, batch):
        raise TagInputError("--batch-size", f"the plan is for a batch of {plan['batch_size']}, not {batch}")
    profiles = _profiles(args, spec.name)
    emission = emit(spec, topology, strategy, args.device_kind, plan=plan,
                    profiles=profiles, fusion=_fusion(args, spec.name))
    if args.fusion is not None:
        predicted = {"iteration_time_s": None, "why": "emitted with a fusion plan, which the prediction does not "
                                                      "cost; emit without --fusion to record one"}
    else:
        predicted = predict_emission(emission, profiles, *_communication(args, topology))
    write_emission(emission, out, force=args.force, prediction=predicted)
    summary = emission.summary()
    if args.json:
        print_json({**summary, "out": str(out), "notes": emission.notes})
        return 0
    print(f"wrote {out}: {summary['emitted_ops']:,} ops (single-device step: {summary['single_device_ops']:,}), "
          f"{summary['collectives']} collective ops, {summary['device_kind']} devices, batch {summary['batch_size']}, "
          f"in {summary['emit_seconds']:.1f} s")
    if "fusion" in summary:
        f = summary["fusion"]
        print(f"fusion: {f['patterns']} patterns ({f['ops_fused']} ops), {f['clusters']} XLA clusters: "
              f"{f['nodes_marked']} nodes with _XlaCompile, {f['calls']} region calls of {f['ops_compiled']} ops")
    for note in emission.notes:
        print(f"note: {note}")
    print(f"run it here: tag run {out} --check" if summary["device_kind"] == "cpu"
          else f"see {out / 'README.txt'} to run it on the cluster")
    return 0
