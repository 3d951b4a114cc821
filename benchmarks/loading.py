"""Loading a GGUF registry model: the first load (dequantise the GGUF, write safetensors) against a cached
load (read the safetensors), each in a fresh process, side by side in one run; prints the ratio.

    .venv/bin/python benchmarks/loading.py --model smollm2-135m --repeats 2
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile


def _worker(model: str) -> None:
    import time

    t0 = time.perf_counter()
    import torch  # noqa: F401  (the same imports for both loads: timed apart from them)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: F401
    from transformers.models.gemma3 import modeling_gemma3  # noqa: F401
    from transformers.models.llama import modeling_llama  # noqa: F401

    import litm

    t1 = time.perf_counter()
    litm.load_model(model, reuse=False)
    print(json.dumps({"import": t1 - t0, "seconds": time.perf_counter() - t1}))


def _measure(model: str, cache: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", model], env={**os.environ, "LITM_CACHE": cache},
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args.worker)
        return 0
    cold, warm = [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as cache:  # an empty cache: the load dequantises
            cold.append(_measure(args.model, cache))
            warm.append(_measure(args.model, cache))  # the same cache, now filled
    print(f"model {args.model}, {args.repeats} repeats, each load in a fresh process")
    print(f"{'load':>22} {'best s':>8} {'all s':>24} {'imports s':>10}")
    for name, runs in (("first (dequantise)", cold), ("cached (safetensors)", warm)):
        secs = [r["seconds"] for r in runs]
        print(f"{name:>22} {min(secs):8.2f} {', '.join(f'{x:.2f}' for x in secs):>24} "
              f"{min(r['import'] for r in runs):10.2f}")
    best = lambda runs: min(r["seconds"] for r in runs)  # noqa: E731
    print(f"cached load is {best(cold) / best(warm):.1f}x faster than the first "
          f"({(best(cold) + cold[0]['import']) / (best(warm) + warm[0]['import']):.1f}x with the imports)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
