"""A position sweep scored by forced choice with and without a prefix tree, side by side in one run: the
prompts for gold at positions k < j share everything up to the k-th document, so the tree prefills each
shared prefix once.  Prints prefill tokens and seconds for both, their ratios, and the largest score
difference (they must agree).

    .venv/bin/python benchmarks/shared_prefix.py --docs 20 --positions 0,4,9,14,19 --examples 2
"""
from __future__ import annotations

import argparse
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--docs", type=int, default=20)
    ap.add_argument("--positions", default="0,4,9,14,19")
    ap.add_argument("--examples", type=int, default=2)
    args = ap.parse_args()

    import numpy as np

    import litm
    from litm import runner
    from litm.experiment import load_examples, prompt_for
    from litm.runner import candidates

    lm = litm.load_model(args.model)
    positions = tuple(int(p) for p in args.positions.split(","))
    cfg = litm.SweepConfig(task="qa", model=args.model, num_docs=args.docs, positions=positions, limit=args.examples)
    examples = load_examples(cfg)
    prompts = [prompt_for(e, "documents", p, cfg, lm.tokenizer) for e in examples for p in positions]
    choices = [candidates(e) for e in examples for _ in positions]
    cands, gold = [c for c, _ in choices], [g for _, g in choices]
    runner.loglik(lm, prompts[:1], [cands[0][0]], 1)  # warm-up
    t0 = time.perf_counter()
    plain = runner.choice(lm, prompts, cands, gold, batch_size=1)
    t_plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    shared, stats = runner.shared_choice(lm, prompts, cands, gold)
    t_shared = time.perf_counter() - t0
    diff = max(float(np.max(np.abs(np.subtract(a.candidate_logliks, b.candidate_logliks))))
               for a, b in zip(plain, shared))
    print(f"model {lm.name}: {args.examples} questions x positions {positions} of {args.docs} documents, "
          f"{len(prompts)} prompts, forced choice over {len(cands[0])} candidates")
    print(f"{'':>14} {'prefill tokens':>15} {'seconds':>9}")
    print(f"{'unshared':>14} {stats.total_tokens:15d} {t_plain:9.2f}")
    print(f"{'prefix tree':>14} {stats.prefill_tokens:15d} {t_shared:9.2f}")
    print(f"tokens {stats.saving:.2f}x fewer, time {t_plain / t_shared:.2f}x less; "
          f"largest score difference {diff:.1e} nats; same ranks: {[a.gold_rank for a in plain] == [b.gold_rank for b in shared]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
