"""`tag models`: list the model zoo."""

from __future__ import annotations

from ._common import print_json


def register(subparsers) -> None:
    parser = subparsers.add_parser("models", help="list the model zoo and each model's options")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(run=run)


def run(args) -> int:
    from tag_core.capture.models import BENCHMARK_MODELS, ZOO, zoo_defaults

    rows = [
        {
            "model": name,
            "benchmark": name in BENCHMARK_MODELS,
            "description": (ZOO[name].__doc__ or "").strip().splitlines()[0] if ZOO[name].__doc__ else "",
            "options": zoo_defaults(name),
        }
        for name in ZOO
    ]
    if args.json:
        print_json(rows)
        return 0
    for row in rows:
        options = ", ".join(f"{k}={v}" for k, v in row["options"].items())
        print(f"{row['model']:<14} {options}")
    print("\nOptions go in brackets, e.g. 'mobilenet_v2[image_size=96]'; a user model is path/to/file.py:function.")
    return 0
