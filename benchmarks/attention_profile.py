"""Time and peak memory of a plain forward, our attention profile, and eager `output_attentions=True`.

Each measurement runs in its own process (peak RSS is per process), on the same prompt, side by side in
one run, `--repeats` times in turn (plain, profile, eager, plain, ...); the table gives the medians, and
its ratios are profile/plain and eager/plain of the medians.  Eager attention is skipped where its layers x
heads x n x n weights alone would not fit in memory.

    .venv/bin/python benchmarks/attention_profile.py --lengths 1024,2048,4096,8192 --repeats 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakRSS:
    """Peak memory of this process above what it held on entry, sampled every 2 ms (MB): resident memory, or
    what `read` returns."""

    def __init__(self, read=_rss_mb):
        self.read = read

    def __enter__(self):
        import threading

        self.base, self.peak, self._done = self.read(), 0.0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._done.is_set():
            self.peak = max(self.peak, self.read())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        self.extra_mb = max(self.peak, self.read()) - self.base


def _measure(method: str, model: str, length: int) -> dict:
    """One method at one length, in this process: seconds, and peak resident memory above what the
    process held just before the call (weights, prompt)."""
    from dataclasses import replace

    import torch

    import litm
    from litm.attention import profile
    from litm.experiment import docs_for_length, load_examples
    from litm.ordering import gold_at, with_num_documents
    from litm.prompts import Variant, render

    lm = litm.load_model(model, attn_implementation="eager" if method == "eager" else "sdpa")
    cfg = litm.SweepConfig(task="qa", model=model, limit=1, positions=(0,), num_docs=1, scoring="loglik")
    n = docs_for_length(cfg, lm.tokenizer, length)
    ex = with_num_documents(load_examples(replace(cfg, num_docs=400))[0], n)
    prompt = render(gold_at(ex, n // 2), lm.tokenizer, Variant())
    ids = torch.tensor([prompt.input_ids])
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        with torch.inference_mode():
            if method == "plain":
                lm.model(input_ids=ids, use_cache=False, logits_to_keep=1)
            elif method == "profile":
                profile(lm, prompt, queries="last")
            else:
                lm.model(input_ids=ids, use_cache=False, logits_to_keep=1, output_attentions=True)
        seconds = time.perf_counter() - t0
    return {"tokens": len(prompt.input_ids), "seconds": seconds, "extra_mb": mem.extra_mb}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--lengths", default="1024,2048,4096,8192")
    ap.add_argument("--repeats", type=int, default=3, help="processes per method and length; medians reported")
    ap.add_argument("--worker", nargs=2, metavar=("METHOD", "LENGTH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(_measure(args.worker[0], args.model, int(args.worker[1]))))
        return 0
    from litm.models import load_model

    cfg = load_model(args.model).model.config.get_text_config()
    avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    print(f"model {args.model}: {cfg.num_hidden_layers} layers x {cfg.num_attention_heads} heads; "
          f"{avail / 2**30:.1f} GiB available")
    print(f"{'tokens':>7} {'plain s':>8} {'plain MB':>9} {'profile s':>10} {'profile MB':>11} {'eager s':>8} "
          f"{'eager MB':>9} {'prof/plain t':>12} {'prof/plain m':>12} {'eager/plain t':>13} {'eager/plain m':>13}")
    for length in [int(x) for x in args.lengths.split(",")]:
        runs: dict[str, list[dict]] = {}
        weights = cfg.num_hidden_layers * cfg.num_attention_heads * length * length * 4
        for _ in range(args.repeats):
            for method in ("plain", "profile", "eager"):
                if method != "eager" or weights <= 0.7 * avail:  # eager only where its weights fit
                    out = subprocess.run([sys.executable, __file__, "--model", args.model, "--worker", method,
                                          str(length)], capture_output=True, text=True, check=True)
                    runs.setdefault(method, []).append(json.loads(out.stdout.strip().splitlines()[-1]))
        row = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
        p, q, e = row["plain"], row["profile"], row.get("eager")
        eager = (f"{e['seconds']:8.2f} {e['extra_mb']:9.0f}" if e else f"{'skipped':>8} {'(too big)':>9}")
        ratios = (f"{e['seconds'] / p['seconds']:13.2f} {e['extra_mb'] / max(p['extra_mb'], 1):13.2f}" if e
                  else f"{'-':>13} {'-':>13}")
        print(f"{int(p['tokens']):7d} {p['seconds']:8.2f} {p['extra_mb']:9.0f} {q['seconds']:10.2f} {q['extra_mb']:11.0f} "
              f"{eager} {q['seconds'] / p['seconds']:12.2f} {q['extra_mb'] / max(p['extra_mb'], 1):12.2f} {ratios}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
