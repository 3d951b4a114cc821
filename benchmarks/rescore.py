"""Rescore stored records on this machine and compare: do this CPU's kernels give the numbers another machine
stored? A run resumed elsewhere adds to the same folders (the device type in a run's identity is `cpu` on every
CPU), so this measures what that mixes in: per record, the gold margin's change and whether the forced choice
agrees; over the records, the mean change with its 95% t interval (a shift that would bias a contrast between
positions run on different machines) and its SD (noise that only widens intervals).

    .venv/bin/python benchmarks/rescore.py results/paper/0fc3460c224f29a6 --n 20

Each folder's manifest gives the run's identity (task, model, size, condition, position, dtype ...); the first
`--n` examples of its data are scored again, in the stored dtype, into a temporary folder, and matched to the
stored records by example id and prompt hash.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

SWEEP_FIELDS = ("task", "model", "num_docs", "scoring", "query_aware", "template", "chat", "seed",
                "sentences_per_doc", "generate_docs")


def rescore(folder: Path, n: int, out: Path) -> list[tuple[dict, dict]]:
    from litm.experiment import SweepConfig, sweep
    from litm.models import load_model

    manifest = json.loads((folder / "manifest.json").read_text())
    c = manifest["config"]
    if c.get("kind") != "sweep":
        raise SystemExit(f"{folder}: a {c.get('kind')!r} run; this benchmark rescores position sweeps.")
    cond = c["condition"]
    data = "generated" if str(c["data"]).startswith("generated") else c["data"]  # the manifest names generated data
    config = SweepConfig(**{k: c[k] for k in SWEEP_FIELDS if k in c}, data=data, limit=n, results_dir=str(out),
                         progress=False, positions=(c["position"],) if cond == "documents" else (),
                         closedbook=cond == "closedbook", oracle=cond == "oracle")
    lm = load_model(c["model"], dtype=c["dtype"], attn_implementation=c.get("attn_implementation", "sdpa"))
    new = {r["example_id"]: r for r in sweep(config, model=lm).to_dict("records")}
    stored = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
    pairs = [(s, new[s["example_id"]]) for s in stored if s["example_id"] in new]
    changed = [s["example_id"] for s, r in pairs if s["prompt_sha256"] != r["prompt_sha256"]]
    if changed:
        raise SystemExit(f"{folder}: the prompts of {changed[:3]} differ from the stored ones, so this is not a "
                         "rescore of the same input (data or template changed since they were stored).")
    return pairs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path, help="results folders (each with manifest.json, records.jsonl)")
    ap.add_argument("--n", type=int, default=20, help="examples to rescore from each folder (its first n)")
    args = ap.parse_args()
    from litm.paper import hardware
    from litm.stats import mean_interval

    print(f"This machine: {hardware()}\n")
    print("| folder | model | task, size | condition | dtype | records | prompt tokens | margin change, mean [95% t] "
          "| SD | largest | same decision | same gold rank | s a record here / stored |")
    print("|---|---|---|---|---|---:|---|---|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for folder in args.folders:
            pairs = rescore(folder, args.n, Path(tmp) / folder.name)
            if not pairs:
                print(f"| {folder.name} | no stored record among the first {args.n} examples |")
                continue
            c = json.loads((folder / "manifest.json").read_text())["config"]
            d = [r["gold_margin"] - s["gold_margin"] for s, r in pairs]
            mean, lo, hi = mean_interval(d)
            sd = statistics.stdev(d) if len(d) > 1 else float("nan")
            same = sum(bool(s["correct"]) == bool(r["correct"]) for s, r in pairs)
            rank = sum(s.get("gold_rank") == r.get("gold_rank") for s, r in pairs)
            toks = [s["prompt_tokens"] for s, _ in pairs]
            stored_s, here_s = (sum(x["latency_s"] for x in side) / len(pairs) for side in zip(*pairs))
            where = c["condition"] + ("" if c.get("position") is None else f" at {c['position'] + 1}")
            print(f"| {folder.name} | {c['model']} | {c['task']} {c['num_docs']} | {where} | {c['dtype']} | "
                  f"{len(pairs)} | {min(toks)}-{max(toks)} | {mean:+.3f} [{lo:+.3f}, {hi:+.3f}] | {sd:.3f} | "
                  f"{max(map(abs, d)):.3f} | {same}/{len(pairs)} | {rank}/{len(pairs)} | "
                  f"{here_s:.1f} / {stored_s:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
