"""A position sweep scored by forced choice with and without a prefix tree, side by side in one run: the
prompts for gold at positions k < j share everything up to the k-th document, so the tree prefills each
shared prefix once.  Unshared is how a study scores condition by condition (batches of `--batch-size`
prompts, `runner.choice`); the tree takes a batch of `--batch-size` questions under every condition at once
(`runner.shared_choice`; `runner.score(..., shared_prefix=True)`. `Study.run` scores condition by condition,
one stored run each, and the studies do not use the tree: on a 2-core CPU it ran slower, docs/paper.md).  Prints prefill tokens and seconds
for both, their ratios, and the largest score difference (float32 agrees to its rounding; bfloat16's piecewise
prefill rounds differently, up to 0.79 nats at 20 documents).

    .venv/bin/python benchmarks/shared_prefix.py --task qa --docs 10 --positions 0,4,9 --examples 8
    .venv/bin/python benchmarks/shared_prefix.py --task kv --docs 10 --positions 0,4,9 --no-closedbook
"""
from __future__ import annotations

import argparse
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="qa", choices=("qa", "kv"))
    ap.add_argument("--docs", type=int, default=10)
    ap.add_argument("--positions", default="0,4,9")
    ap.add_argument("--closedbook", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--oracle", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--examples", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=4)
    args = ap.parse_args()

    import numpy as np

    import litm
    from litm import runner
    from litm.experiment import load_examples, prompt_for
    from litm.models import synchronize
    from litm.runner import candidates

    lm = litm.load_model(args.model)
    cfg = litm.SweepConfig(task=args.task, model=args.model, num_docs=args.docs, closedbook=args.closedbook,
                           oracle=args.oracle, positions=tuple(int(p) for p in args.positions.split(",")),
                           limit=args.examples)
    examples, conds, b = load_examples(cfg), cfg.conditions(), args.batch_size
    prompts = {(c, e.id): prompt_for(e, *c, cfg, lm.tokenizer) for c in conds for e in examples}
    choices = {e.id: candidates(e) for e in examples}

    def scored(keys, fn):
        return dict(zip(keys, fn([prompts[k] for k in keys], [choices[k[1]][0] for k in keys],
                                 [choices[k[1]][1] for k in keys])))

    runner.loglik(lm, [prompts[conds[0], examples[0].id]], [choices[examples[0].id][0][0]], 1)  # warm-up
    synchronize(lm.device)
    t0 = time.perf_counter()
    plain = {}
    for c in conds:  # condition by condition, batches of b prompts
        plain.update(scored([(c, e.id) for e in examples], lambda p, cs, g: runner.choice(lm, p, cs, g, b)))
    synchronize(lm.device)  # scores come back as Python floats, which waits anyway; explicit for CUDA
    t_plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    shared, total, prefilled = {}, 0, 0
    for start in range(0, len(examples), b):  # b questions under every condition, one prefix tree
        keys = [(c, e.id) for e in examples[start:start + b] for c in conds]
        out, stats = runner.shared_choice(lm, [prompts[k] for k in keys], [choices[k[1]][0] for k in keys],
                                          [choices[k[1]][1] for k in keys])
        shared.update(zip(keys, out))
        total, prefilled = total + stats.total_tokens, prefilled + stats.prefill_tokens
    synchronize(lm.device)
    t_shared = time.perf_counter() - t0
    diff = max(float(np.max(np.abs(np.subtract(plain[k].candidate_logliks, shared[k].candidate_logliks))))
               for k in plain)
    print(f"model {lm.name}: {args.task}, {len(examples)} questions x {len(conds)} conditions {conds} of {args.docs} "
          f"documents, {len(prompts)} prompts, forced choice over {len(choices[examples[0].id][0])} candidates, "
          f"batches of {b}")
    print(f"{'':>14} {'prefill tokens':>15} {'seconds':>9}")
    print(f"{'unshared':>14} {total:15d} {t_plain:9.2f}")
    print(f"{'prefix tree':>14} {prefilled:15d} {t_shared:9.2f}")
    same = all(plain[k].gold_rank == shared[k].gold_rank for k in plain)
    print(f"tokens {total / prefilled:.2f}x fewer, time {t_plain / t_shared:.2f}x less; "
          f"largest score difference {diff:.1e} nats; same ranks: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
