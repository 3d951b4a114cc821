"""Time and peak memory of scoring one prompt with each in-model lever against the plain model.

The same prompt's gold answer is scored by `runner.loglik` (the path a sweep takes) plainly, under attention
calibration, positional rescaling, channel scaling and parallel documents, each in its own process (peak memory
is per process), side by side in one run and `--repeats` times in turn (plain, calibration, ..., plain, ...); the
table gives the medians and the ratios of the medians to plain.  The first three act in the second half of the
full-attention layers, as notebook 08 does.  The calibration's bias is zeros of the prompt's layout and channel
scaling scales channel 0 by 0: the values do not change the work done.  Parallel documents score the same
documents rendered as parallel blocks (`Variant(parallel=True)`: no document numbers, so a few tokens fewer).
On CUDA (`--device cuda`) memory is the peak allocated by torch above what the weights hold.

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


METHODS = ("plain", "calibration", "rescaling", "channel_scaling", "parallel")


def _measure(method: str, model: str, length: int, device: str | None) -> dict:
    from dataclasses import replace

    import torch

    import litm
    from litm import runner
    from litm.experiment import docs_for_length, load_examples
    from litm.interventions import (Calibration, ChannelScaling, ParallelDocuments, PositionalRescaling,
                                    default_layers, intervene, prompt_layout, spaced_ratios, weights_fingerprint)
    from litm.models import synchronize
    from litm.ordering import gold_at, with_num_documents
    from litm.prompts import Variant, render

    lm = litm.load_model(model, device=device)
    cfg = litm.SweepConfig(task="qa", model=model, limit=1, positions=(0,), num_docs=1, scoring="loglik")
    n = docs_for_length(cfg, lm.tokenizer, length)
    ex = gold_at(with_num_documents(load_examples(replace(cfg, num_docs=400))[0], n), n // 2)
    prompt = render(ex, lm.tokenizer, Variant(parallel=method == "parallel"))
    text = lm.text_config
    layers = default_layers(lm)
    iv = {"plain": None,
          "calibration": Calibration(tuple(((0.0,) * n,) for _ in layers), layers, model=weights_fingerprint(lm),
                                     layout=tuple(sorted(prompt_layout(prompt).items()))),
          "rescaling": PositionalRescaling(spaced_ratios(range(text.num_key_value_heads)), layers),
          "channel_scaling": ChannelScaling(0, layers, 0.0), "parallel": ParallelDocuments()}[method]
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
    print(f"model {args.model}; medians of {args.repeats} processes per method; calibration, rescaling and channel "
          "scaling in the second half of the full-attention layers; each lever's time and memory over plain's")
    print(f"{'tokens':>7} {'plain s':>8} {'plain MB':>9} " + " ".join(f"{m + ' t':>17} {m + ' m':>17}"
                                                               for m in METHODS[1:]))
    for length in [int(x) for x in args.lengths.split(",")]:
        runs: dict[str, list[dict]] = {}
        for _ in range(args.repeats):
            for method in METHODS:
                cmd = [sys.executable, __file__, "--model", args.model, "--worker", method, str(length)]
                out = subprocess.run(cmd + (["--device", args.device] if args.device else []), capture_output=True,
                                     text=True, check=True)
                runs.setdefault(method, []).append(json.loads(out.stdout.strip().splitlines()[-1]))
        row = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
        p = row["plain"]
        print(f"{int(p['tokens']):7d} {p['seconds']:8.2f} {p['extra_mb']:9.0f} " + " ".join(
            f"{row[m]['seconds'] / p['seconds']:17.2f} {row[m]['extra_mb'] / max(p['extra_mb'], 1):17.2f}"
            for m in METHODS[1:]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
