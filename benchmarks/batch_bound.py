"""How far scores move with batch size: one sweep at batch 1 (no padding) and at a larger batch, per dtype, on
the default model; prints the largest change of the gold log-likelihood and of the margin against
`runner.BATCH_TOLERANCE`, and whether any forced-choice decision changed.

    .venv/bin/python benchmarks/batch_bound.py --limit 10 --docs 10 --batch-size 4
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--task", default="qa", choices=("qa", "kv"))
    ap.add_argument("--docs", type=int, default=10)
    ap.add_argument("--positions", default="0,4,9")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=4)
    args = ap.parse_args()

    from litm import SweepConfig, sweep
    from litm.models import load_model
    from litm.runner import BATCH_TOLERANCE

    positions = tuple(int(p) for p in args.positions.split(","))
    print(f"{args.model}, {args.task}, {args.docs} documents, gold at {positions}, {args.limit} examples, "
          f"forced choice: batch 1 against batch {args.batch_size}")
    print("| dtype | records | longest prompt | max change of gold log-likelihood | max change of margin | bound "
          "| decisions changed | smallest margin |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for dtype in args.dtypes.split(","):
        lm = load_model(args.model, device="cpu", dtype=dtype)
        runs = {}
        for bs in (1, args.batch_size):
            cfg = SweepConfig(task=args.task, num_docs=args.docs, positions=positions, closedbook=False, limit=args.limit,
                              scoring="choice", batch_size=bs, results_dir=tempfile.mkdtemp(), progress=False)
            runs[bs] = sweep(cfg, lm).set_index(["condition", "position", "example_id"]).sort_index()
        a, b = runs[1], runs[args.batch_size].loc[runs[1].index]
        print(f"| {dtype} | {len(a)} | {a.prompt_tokens.max()} | {(a.gold_loglik - b.gold_loglik).abs().max():.2g} | "
              f"{(a.gold_margin - b.gold_margin).abs().max():.2g} | {BATCH_TOLERANCE[dtype]:g} | "
              f"{int((a.correct != b.correct).sum())} | {a.gold_margin.abs().min():.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
