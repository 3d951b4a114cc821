"""Two exact rearrangements of the key-value sweeps' costliest work, each against the path the runner takes, side by
side in one run (median of `--repeats`, interleaved), with the largest difference in the outputs:

1. `split`: the forced-choice candidate pass's attention for one layer at a 75-pair prompt's shape (about 5,400
   prompt tokens, 75 UUID candidates of about 33 tokens side by side under a tree mask). The runner hands SDPA one
   mask over prompt and candidates; the split attends to the prompt's keys with no mask and to the candidates'
   keys under the tree mask, and merges the two by their log-sum-exp (the CPU flash kernel returns it).
2. `local`: Gemma 3's prefill of a `--tokens` prompt, its sliding-window layers as transformers runs them (SDPA
   over every key under a window mask) against blocks of 512 queries, each over only the keys its window reaches.

    .venv/bin/python benchmarks/candidate_pass.py                  # both
    .venv/bin/python benchmarks/candidate_pass.py --only split --prompt 5400 --candidates 75 --length 33
"""
from __future__ import annotations

import argparse
import statistics
import time


def timed(fns: dict, repeats: int) -> dict:
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def split_attention(q, k, v, prompt: int, mask):
    """Attention of `q` over `k`/`v` as two calls merged by their log-sum-exp: the first `prompt` keys unmasked,
    the rest under `mask`'s columns for them (additive, the query's dtype)."""
    import torch

    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    o1, l1 = flash(q, k[:, :, :prompt], v[:, :, :prompt], 0.0, False)
    o2, l2 = flash(q, k[:, :, prompt:], v[:, :, prompt:], 0.0, False, attn_mask=mask[..., prompt:])
    lse = torch.logaddexp(l1, l2)
    return (o1.float() * (l1 - lse).exp()[..., None] + o2.float() * (l2 - lse).exp()[..., None]).to(q.dtype)


def split(args) -> None:
    import torch
    import torch.nn.functional as F

    heads, dim, prompt = 9, 64, args.prompt  # SmolLM2-135M's query heads and head size
    width = args.candidates * (args.length - 1)  # the slots the pass feeds: every candidate token but its last
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, width, dim, generator=g).bfloat16()
    k = torch.randn(1, heads, prompt + width, dim, generator=g).bfloat16()
    v = torch.randn(1, heads, prompt + width, dim, generator=g).bfloat16()
    grp = torch.arange(width) // (args.length - 1)
    tree = (grp[:, None] == grp[None]) & torch.ones(width, width, dtype=torch.bool).tril()
    see = torch.cat([torch.ones(width, prompt, dtype=torch.bool), tree], -1)[None, None]
    see = torch.zeros(see.shape, dtype=q.dtype).masked_fill_(~see, torch.finfo(q.dtype).min)  # additive, as the runner

    def one_mask():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=see)

    def two_parts():
        return split_attention(q, k, v, prompt, see)

    with torch.inference_mode():
        diff = (one_mask().float() - two_parts().float()).abs().max().item()
        t = timed({"one mask": one_mask, "split": two_parts}, args.repeats)
    print(f"candidate attention, one layer: {prompt} prompt keys, {args.candidates} candidates x {args.length} tokens")
    print(f"  one mask {t['one mask']:.3f} s, split {t['split']:.3f} s: split is {t['one mask'] / t['split']:.2f}x "
          f"(largest output difference {diff:.2g}, bfloat16)")


def local(args) -> None:
    import torch
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    import litm

    block = 512

    def blocks(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None, **kw):
        n = query.shape[2]
        if sliding_window is None or n != key.shape[2] or n <= 2 * block:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kw)
        out = []
        for s in range(0, n, block):
            e, ks = min(s + block, n), max(0, s - sliding_window + 1)
            if attention_mask is None:
                i, j = torch.arange(s, e)[:, None], torch.arange(ks, e)[None]
                m = ((j <= i) & (i - j < sliding_window))[None, None]
            else:
                m = attention_mask[:, :, s:e, ks:e]
            out.append(sdpa_attention_forward(module, query[:, :, s:e], key[:, :, ks:e], value[:, :, ks:e], m,
                                              dropout=dropout, scaling=scaling, **kw)[0])
        return torch.cat(out, dim=1), None

    AttentionInterface.register("bench_local", blocks)
    ALL_MASK_ATTENTION_FUNCTIONS.register("bench_local", sdpa_mask)
    lm = litm.load_model("gemma3-270m")
    configs = list({id(c): c for c in (lm.model.config, lm.text_config)}.values())
    ids = torch.randint(100, 20000, (1, args.tokens), generator=torch.Generator().manual_seed(0))

    def prefill(name):
        for c in configs:
            c._attn_implementation = name
        try:
            with torch.inference_mode():
                return lm.model(input_ids=ids, logits_to_keep=1).logits.float()
        finally:
            for c in configs:
                c._attn_implementation = "sdpa"

    diff = (prefill("sdpa") - prefill("bench_local")).abs().max().item()
    t = timed({"sdpa": lambda: prefill("sdpa"), "local": lambda: prefill("bench_local")}, args.repeats)
    print(f"Gemma 3 270M prefill, {args.tokens} tokens ({lm.model.dtype})")
    print(f"  SDPA with the window mask {t['sdpa']:.2f} s, local blocks {t['local']:.2f} s: local is "
          f"{t['sdpa'] / t['local']:.2f}x (largest last-token logit difference {diff:.2g})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="split,local")
    ap.add_argument("--prompt", type=int, default=5400)
    ap.add_argument("--candidates", type=int, default=75)
    ap.add_argument("--length", type=int, default=34, help="tokens a candidate takes (a UUID: about 33, +1)")
    ap.add_argument("--tokens", type=int, default=5300)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    parts = {"split": split, "local": local}
    for name in args.only.split(","):
        parts[name](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
