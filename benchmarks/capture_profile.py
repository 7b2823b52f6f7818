"""How long capture and profiling take here, per zoo model, with peak RSS.

Each model runs in its own process (so peak RSS is that model's alone):
`tag capture MODEL` then `tag profile MODEL --batch-sizes ... --runs ...`.
Writes benchmarks/capture_profile.json and benchmarks/capture_profile.md.
The profiles stay in $TAG_HOME (default .tag-bench) for the other benchmarks.

    python benchmarks/capture_profile.py [--models vgg19,...] [--batch-sizes 2,4] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TAG = str(Path(sys.executable).parent / "tag")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="vgg19,resnet101,inception_v3,mobilenet_v2,transformer,bert_base,mlp,small_cnn")
    parser.add_argument("--batch-sizes", default="2,4")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    env = {**os.environ, "TAG_HOME": os.environ.get("TAG_HOME", str(HERE.parent / ".tag-bench"))}
    results = []
    for model in args.models.split(","):
        # One wrapper process per model so each gets its own RSS high-water mark.
        code = (
            "import json,resource,subprocess,sys,time;"
            "t=time.perf_counter();c=subprocess.run(sys.argv[1:4]+['--json'],capture_output=True,text=True);"
            "a=time.perf_counter()-t;r1=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss;"
            "t=time.perf_counter();p=subprocess.run(sys.argv[4:],capture_output=True,text=True);"
            "b=time.perf_counter()-t;r2=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss;"
            "assert c.returncode==0 and p.returncode==0,(c.stderr[-1500:],p.stderr[-1500:]);"
            "print(json.dumps({'capture_s':a,'profile_s':b,'capture_rss_mib':r1/1024,'profile_rss_mib':r2/1024,"
            "'summary':json.loads(c.stdout)}))"
        )
        command = [sys.executable, "-c", code, TAG, "capture", model,
                   TAG, "profile", model, "--batch-sizes", args.batch_sizes, "--runs", str(args.runs)]
        print(f"{model} ...", file=sys.stderr, flush=True)
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"{model} failed:\n{result.stderr[-3000:]}")
        row = json.loads(result.stdout.strip().splitlines()[-1])
        summary = row.pop("summary")
        row.update(model=model, ops=summary["ops"], parameters=summary["parameters"],
                   batch_size=summary["batch_size"])
        results.append(row)
        print(f"  {row}", file=sys.stderr, flush=True)
    report = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "profile_batch_sizes": args.batch_sizes,
        "runs": args.runs,
        "results": results,
    }
    (HERE / "capture_profile.json").write_text(json.dumps(report, indent=2))
    lines = [
        "# Capture and profiling time per zoo model",
        "",
        f"Measured with `python benchmarks/capture_profile.py` on this machine ({report['machine']}).",
        f"Capture: `tag capture MODEL` at the model's default batch size (traced twice, at B and B+1).",
        f"Profile: `tag profile MODEL --batch-sizes {args.batch_sizes} --runs {args.runs}` (2 warm-up runs each, "
        "full tracing, inter-op parallelism 1). Wall times include starting Python and importing TF (~3 s).",
        "",
        "| model | batch | ops | parameters | capture s | capture peak RSS MiB | profile s | profile peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['model']} | {r['batch_size']} | {r['ops']:,} | {r['parameters']:,} | {r['capture_s']:.1f} | "
            f"{r['capture_rss_mib']:.0f} | {r['profile_s']:.1f} | {r['profile_rss_mib']:.0f} |"
        )
    (HERE / "capture_profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
