"""Examples per second on the same prompts and model: the paper-style loop (one example at a time, greedy
generation of up to 100 tokens) against our batched generation that stops at a newline, our
log-likelihood scoring and our forced choice (the prompt prefilled once, every candidate scored from its
cache).  Side by side in one run: `--repeats` rounds over every method, each timed between device
synchronisations, the median kept; prints the ratios to the paper-style loop.

    .venv/bin/python benchmarks/sweep_throughput.py --examples 8 --docs 10 --batch-size 4
"""
from __future__ import annotations

import argparse
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--examples", type=int, default=8)
    ap.add_argument("--docs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3, help="rounds over every method; each keeps its median")
    args = ap.parse_args()

    import statistics

    import torch

    import litm
    from litm import runner
    from litm.experiment import load_examples, prompt_for
    from litm.models import synchronize
    from litm.runner import candidates

    lm = litm.load_model(args.model)
    cfg = litm.SweepConfig(task="qa", model=args.model, num_docs=args.docs, positions=(args.docs // 2,),
                           limit=args.examples)
    examples = load_examples(cfg)
    prompts = [prompt_for(e, "documents", args.docs // 2, cfg, lm.tokenizer) for e in examples]
    cands = [candidates(e) for e in examples]

    new_tokens = []

    def paper_loop():
        for p in prompts:  # one at a time, no stop string: up to max_new_tokens new tokens (or end of turn)
            ids = torch.tensor([list(p.input_ids)], device=lm.device)
            with torch.inference_mode():
                out = lm.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                        max_new_tokens=args.max_new_tokens, temperature=None, top_p=None,
                                        top_k=None, pad_token_id=lm.tokenizer.pad_token_id)
            new_tokens.append(out.shape[1] - ids.shape[1])

    def prefill_only():
        for p in prompts:  # what any one-pass scoring must at least do: one forward over each prompt
            with torch.inference_mode():
                lm.model(input_ids=torch.tensor([list(p.input_ids)], device=lm.device), use_cache=False,
                         logits_to_keep=1)

    slots = [[t for a in c[0] for t in runner._cont_ids(lm, p, a)[:-1]] for p, c in zip(prompts, cands)]

    def prefill_with_candidates():
        for p, extra in zip(prompts, slots):  # the prompt and every candidate token forced choice feeds, as one row
            with torch.inference_mode():
                lm.model(input_ids=torch.tensor([list(p.input_ids) + extra], device=lm.device), use_cache=False,
                         logits_to_keep=1)

    methods = {
        "paper-style loop": paper_loop,
        "batched generate, newline stop": lambda: runner.generate(lm, prompts, args.max_new_tokens, args.batch_size),
        "log-likelihood": lambda: runner.loglik(lm, prompts, [e.answers[0] for e in examples], args.batch_size),
        "forced choice": lambda: runner.choice(lm, prompts, [c[0] for c in cands], [c[1] for c in cands],
                                               args.batch_size),
        "prefill only, one at a time": prefill_only,
        "prefill + candidate tokens": prefill_with_candidates,
    }
    runner.loglik(lm, prompts[:1], [examples[0].answers[0]], 1)  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(args.repeats):
        for name, fn in methods.items():
            synchronize(lm.device)
            t0 = time.perf_counter()
            fn()
            synchronize(lm.device)
            seconds[name].append(time.perf_counter() - t0)
    rates = {name: len(prompts) / statistics.median(s) for name, s in seconds.items()}
    mean_tokens = sum(len(p.input_ids) for p in prompts) / len(prompts)
    print(f"model {lm.name}, {len(prompts)} QA prompts of {args.docs} documents (mean {mean_tokens:.0f} tokens), "
          f"batch size {args.batch_size}, up to {args.max_new_tokens} new tokens")
    print(f"{'method':>32} {'examples/s':>11} {'x paper loop':>13}")
    base = rates["paper-style loop"]
    for name, r in rates.items():
        print(f"{name:>32} {r:11.3f} {r / base:13.2f}")
    fc = rates["forced choice"]
    share = sum(map(len, slots)) / sum(len(p.input_ids) for p in prompts)
    print(f"Forced choice runs at {fc / rates['prefill only, one at a time']:.0%} of the prompts' prefill alone. It "
          f"also feeds each candidate's tokens but the last ({share:.1%} more tokens than the prompts, each "
          f"attending over the whole prompt); at {fc / rates['prefill + candidate tokens']:.0%} of one causal pass "
          "over the prompt and those tokens together.")
    bound = rates["prefill only, one at a time"] / base
    print(f"The paper-style loop generated {sum(new_tokens) / len(new_tokens):.0f} new tokens per example on "
          f"average; its prompt's prefill alone is {1 / bound:.0%} of its time, so scoring that prefills each prompt "
          f"once cannot beat it by more than about {bound:.1f}x here unless batching makes prefill cheaper "
          "(it does on a GPU, barely on a CPU).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
