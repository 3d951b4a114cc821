"""Time and peak memory of scoring one prompt with each intervention against the plain model.

The same prompt's gold answer is scored by `runner.loglik` (the path a sweep takes) plainly, under attention
calibration and under positional rescaling, each in its own process (peak memory is per process), side by
side in one run and `--repeats` times in turn (plain, calibration, rescaling, plain, ...); the table gives the
medians and the ratios of the medians to plain.  Both act in the second half of the full-attention layers,
as notebook 08 does.  The calibration's bias is zeros of the prompt's layout: its values do not change the work done.  On
CUDA (`--device cuda`) memory is the peak allocated by torch above what the weights hold.

    .venv/bin/python benchmarks/interventions.py --lengths 1024,2048,4096 --repeats 3
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import time

from attention_profile import PeakRSS


@functools.cache
def _mallinfo2():
    import ctypes

    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]

    read = ctypes.CDLL("libc.so.6").mallinfo2
    read.restype = Info
    return read


def _heap_mb() -> float:
    """Bytes malloc holds in use (glibc's mallinfo2: small blocks plus mapped ones), in MB."""
    info = _mallinfo2()()
    return (info.uordblks + info.hblkhd) / 2**20


METHODS = ("plain", "calibration", "rescaling")


def _measure(method: str, model: str, length: int, device: str | None) -> dict:
    from dataclasses import replace

    import torch

    import litm
    from litm import runner
    from litm.experiment import docs_for_length, load_examples
    from litm.interventions import (Calibration, PositionalRescaling, default_layers, intervene, prompt_layout,
                                    spaced_ratios, weights_fingerprint)
    from litm.models import synchronize
    from litm.ordering import gold_at, with_num_documents
    from litm.prompts import Variant, render

    lm = litm.load_model(model, device=device)
    cfg = litm.SweepConfig(task="qa", model=model, limit=1, positions=(0,), num_docs=1, scoring="loglik")
    n = docs_for_length(cfg, lm.tokenizer, length)
    ex = gold_at(with_num_documents(load_examples(replace(cfg, num_docs=400))[0], n), n // 2)
    prompt = render(ex, lm.tokenizer, Variant())
    text = lm.text_config
    layers = default_layers(lm)
    iv = {"plain": None,
          "calibration": Calibration(tuple(((0.0,) * n,) for _ in layers), layers, model=weights_fingerprint(lm),
                                     layout=tuple(sorted(prompt_layout(prompt).items()))),
          "rescaling": PositionalRescaling(spaced_ratios(range(text.num_key_value_heads)), layers)}[method]
    cuda = lm.device.type == "cuda"
    with intervene(lm, iv):
        runner.loglik(lm, [prompt], [ex.answers[0]])  # warm-up
        synchronize(lm.device)
        t0 = time.perf_counter()  # timed without the memory sampler, which takes malloc's lock
        runner.loglik(lm, [prompt], [ex.answers[0]])
        synchronize(lm.device)
        seconds = time.perf_counter() - t0
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        with PeakRSS(_heap_mb) as mem:
            runner.loglik(lm, [prompt], [ex.answers[0]])
            synchronize(lm.device)
    extra = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else mem.extra_mb
    return {"tokens": len(prompt.input_ids), "seconds": seconds, "extra_mb": extra}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--lengths", default="1024,2048,4096")
    ap.add_argument("--repeats", type=int, default=3, help="processes per method and length; medians reported")
    ap.add_argument("--device", default=None)
    ap.add_argument("--worker", nargs=2, metavar=("METHOD", "LENGTH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(_measure(args.worker[0], args.model, int(args.worker[1]), args.device)))
        return 0
    print(f"model {args.model}; medians of {args.repeats} processes per method; calibration and rescaling in the "
          "second half of the full-attention layers")
    print(f"{'tokens':>7} " + " ".join(f"{m + ' s':>14} {m + ' MB':>15}" for m in METHODS)
          + f" {'cal/plain t':>11} {'cal/plain m':>11} {'resc/plain t':>12} {'resc/plain m':>12}")
    for length in [int(x) for x in args.lengths.split(",")]:
        runs: dict[str, list[dict]] = {}
        for _ in range(args.repeats):
            for method in METHODS:
                cmd = [sys.executable, __file__, "--model", args.model, "--worker", method, str(length)]
                out = subprocess.run(cmd + (["--device", args.device] if args.device else []), capture_output=True,
                                     text=True, check=True)
                runs.setdefault(method, []).append(json.loads(out.stdout.strip().splitlines()[-1]))
        row = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
        p, c, r = (row[m] for m in METHODS)
        print(f"{int(p['tokens']):7d} " + " ".join(f"{row[m]['seconds']:14.2f} {row[m]['extra_mb']:15.0f}"
                                                 for m in METHODS)
              + f" {c['seconds'] / p['seconds']:11.2f} {c['extra_mb'] / max(p['extra_mb'], 1):11.2f}"
              f" {r['seconds'] / p['seconds']:12.2f} {r['extra_mb'] / max(p['extra_mb'], 1):12.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
