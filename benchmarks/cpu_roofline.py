"""How close the CPU path runs to this machine's limit, in float32 and bfloat16, measured side by side in one run.

1. The peak: GFLOP/s of the matrix products the default models do (SmolLM2-135M's and Gemma 3 270M's
   projections, `--rows` tokens), median of `--repeats`, the dtypes interleaved.
2. Prefill: tokens/s of both models at 512, 2k, 4k and 8k tokens in each dtype, and the fraction of the dtype's
   peak that reaches (counting the projections' FLOPs and attention's: causal, a sliding window where a layer
   has one; the head only at the last token, as the runner asks for).
3. Scoring: forced choice and log-likelihood, questions/s, on notebook 02's first batch of prompts.
4. Settings that might be worth as much, in each dtype: one thread against all, eager attention against SDPA,
   torch.compile (inductor) against none, with its first call's compile time.
5. `profile`: where a prefill's time goes in each dtype (torch.profiler's self time per operator, split into the
   matrix products, attention's kernel and the rest: norms, rotary embeddings, activations, copies), and the
   share of the product peak the products alone reach: what limits the prefill when its share is low.
6. `--conclusions QA,KV`: notebooks 02's and 01's default sweeps on their first QA and KV questions (default
   60,24: their float32 study sizes, `MOST`) in both dtypes: each
   record's margin change against `runner.dtype_bound` (of its prompt length and scores' size), the share of
   forced-choice decisions that agree, and the middle penalty's interval from each dtype against the other's
   point estimate.  The records stay in `--results` (default results/cpu-roofline): a rerun resumes, and every
   number can be read again from them.

bfloat16 runs only where the CPU has bfloat16 matrix units (`litm.models.cpu_bfloat16_units`); without them
torch emulates it far slower, and the benchmark says so and skips it (`--force-bfloat16` runs it anyway).

    .venv/bin/python benchmarks/cpu_roofline.py                       # all of 1-5
    .venv/bin/python benchmarks/cpu_roofline.py --only peak,prefill --lengths 512,2048
    .venv/bin/python benchmarks/cpu_roofline.py --only conclusions --conclusions 60,24
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from litm.models import interleaved_medians  # noqa: E402  (after the path above; imports nothing heavy)

MODELS = ("smollm2-135m", "gemma3-270m")
SECTIONS = ("peak", "prefill", "scoring", "settings", "profile", "conclusions")


def cpu_flags() -> str:
    """The CPU's model name and the vector/matrix flags that matter here, from /proc/cpuinfo (Linux)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU (no /proc/cpuinfo)"
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith(("flags", "Features"))), [])
    keep = [f for f in flags if f.startswith(("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx", "bf16", "sve"))]
    return f"{name}; flags: {' '.join(sorted(set(keep))) or 'none of avx2/avx512/amx/bf16'}"


def projections(cfg) -> list[tuple[str, int, int]]:
    """A decoder layer's matrix products as (name, in, out) from a config: q, k, v, o, gate, up, down."""
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * head, cfg.num_key_value_heads * head
    h, f = cfg.hidden_size, cfg.intermediate_size
    return [("q", h, q), ("k", h, kv), ("v", h, kv), ("o", q, h), ("gate", h, f), ("up", h, f), ("down", f, h)]


def prefill_flops(cfg, tokens: int) -> float:
    """Matmul FLOPs of one prefill of `tokens`: 2 per multiply-add in every projection of every layer, attention's
    scores and weighted sum over the keys each token sees (causal; at most the window in a sliding layer), and
    the head at the last token only."""
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    proj = sum(i * o for _, i, o in projections(cfg)) * 2 * tokens * cfg.num_hidden_layers
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    attn = 0.0
    for kind in types:
        seen = sum(min(t + 1, window) if kind == "sliding_attention" and window else t + 1 for t in range(tokens))
        attn += 2 * 2 * seen * cfg.num_attention_heads * head  # q.k and p.v, 2 FLOPs per multiply-add
    return proj + attn + 2 * cfg.hidden_size * cfg.vocab_size


def peak(cfgs: dict, dtypes: list, rows: int, repeats: int) -> dict:
    import torch

    print(f"\n## 1. Matrix products ({rows} rows, GFLOP/s, median of {repeats}, dtypes interleaved)\n")
    print("| model | product | in x out | " + " | ".join(dtypes) + (" | bf16/fp32 |" if len(dtypes) > 1 else " |"))
    print("|---|---|---|" + "---:|" * (len(dtypes) + (len(dtypes) > 1)))
    best = {dt: 0.0 for dt in dtypes}
    gen = torch.Generator().manual_seed(0)
    for model, cfg in cfgs.items():
        for name, i, o in projections(cfg):
            if name in ("v", "up"):  # the same shape as k and gate
                continue
            mats = {dt: (torch.randn(rows, i, generator=gen).to(getattr(torch, dt)),
                         torch.randn(i, o, generator=gen).to(getattr(torch, dt))) for dt in dtypes}
            med = interleaved_medians({dt: (lambda a=a, b=b: a @ b) for dt, (a, b) in mats.items()}, repeats)
            rate = {dt: 2 * rows * i * o / med[dt] / 1e9 for dt in dtypes}
            for dt in dtypes:
                best[dt] = max(best[dt], rate[dt])
            ratio = f" {rate['bfloat16'] / rate['float32']:.2g}x |" if len(dtypes) > 1 else ""
            print(f"| {model} | {name} | {i} x {o} | " + " | ".join(f"{rate[dt]:.3g}" for dt in dtypes) + f" |{ratio}")
    print("\npeak (the best product): " + ", ".join(f"{dt} {best[dt]:.3g} GFLOP/s" for dt in dtypes))
    return best


def prefill(lms: dict, dtypes: list, lengths: list[int], repeats: int, best: dict) -> None:
    import torch

    print(f"\n## 2. Prefill (tokens/s, median of {repeats}, dtypes interleaved; % of the dtype's product peak)\n")
    print("| model | tokens | " + " | ".join(f"{dt} tok/s | {dt} % peak" for dt in dtypes)
          + (" | bf16/fp32 |" if len(dtypes) > 1 else " |"))
    print("|---|---:|" + "---:|" * (2 * len(dtypes) + (len(dtypes) > 1)))
    for model in MODELS:
        cfg = lms[model, dtypes[0]].text_config
        for n in lengths:
            if n > (getattr(cfg, "max_position_embeddings", n) or n):
                print(f"| {model} | {n} | beyond its window |")
                continue
            ids = torch.randint(10, cfg.vocab_size - 10, (1, n), generator=torch.Generator().manual_seed(n))

            def run(lm):
                with torch.inference_mode():
                    lm.model(input_ids=ids, logits_to_keep=1, use_cache=False)
            med = interleaved_medians({dt: (lambda lm=lms[model, dt]: run(lm)) for dt in dtypes}, repeats)
            flops = prefill_flops(cfg, n)
            cells = [f"{n / med[dt]:.0f} | {100 * flops / med[dt] / 1e9 / best[dt]:.0f}%" for dt in dtypes]
            ratio = f" {med['float32'] / med['bfloat16']:.2f}x |" if len(dtypes) > 1 else ""
            print(f"| {model} | {n} | " + " | ".join(cells) + f" |{ratio}", flush=True)


PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_mkldnn_linear", "mkldnn::_linear_pointwise")
ATTENTION = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math",
             "aten::_safe_softmax", "aten::_softmax")


def split_profile(rows) -> dict:
    """Self time (any unit) per part of a forward pass, from (operator name, self time) rows: the matrix products,
    attention's kernel (SDPA, or eager attention's softmax: its products count as products), and the rest."""
    parts = {"products": 0.0, "attention": 0.0, "rest": 0.0}
    for name, t in rows:
        parts["products" if name in PRODUCTS else "attention" if name in ATTENTION else "rest"] += t
    return parts


def profile(lms: dict, dtypes: list, lengths: list[int], best: dict) -> None:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    print("\n## 5. Where a prefill's time goes (torch.profiler self time, one prefill after a warm-up)\n")
    print("| model | tokens | dtype | ms | products | attention | rest | products' own % of peak "
          "| attention kernel alone, GFLOP/s (% of peak) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for model in MODELS:
        cfg = lms[model, dtypes[0]].text_config
        head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        for n in lengths:
            ids = torch.randint(10, cfg.vocab_size - 10, (1, n), generator=torch.Generator().manual_seed(n))
            proj = sum(i * o for _, i, o in projections(cfg)) * 2 * n * cfg.num_hidden_layers
            for dt in dtypes:
                # one full-attention layer's kernel on its own: causal, grouped keys, as the model calls it
                q, k = (torch.randn(1, h, n, head).to(getattr(torch, dt))
                        for h in (cfg.num_attention_heads, cfg.num_key_value_heads))
                with torch.inference_mode():
                    kernel = interleaved_medians({"sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(
                        q, k, k, is_causal=True, enable_gqa=True)}, 3)["sdpa"]
                kernel_rate = 2 * 2 * n * (n + 1) / 2 * cfg.num_attention_heads * head / kernel / 1e9
                def run(lm=lms[model, dt]):
                    with torch.inference_mode():
                        lm.model(input_ids=ids, logits_to_keep=1, use_cache=False)
                run()
                with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                    run()
                parts = split_profile((e.key, e.self_cpu_time_total) for e in prof.key_averages())
                total = sum(parts.values())
                share = {k: f"{100 * v / total:.0f}%" for k, v in parts.items()}
                rate = 100 * proj / (parts["products"] / 1e6) / 1e9 / best[dt]
                print(f"| {model} | {n} | {dt} | {total / 1e3:.0f} | {share['products']} | {share['attention']} "
                      f"| {share['rest']} | {rate:.0f}% | {kernel_rate:.0f} ({100 * kernel_rate / best[dt]:.0f}%) |",
                      flush=True)


def nb02_config(limit: int, **kw):
    """Notebook 02's default sweep (10 generated documents, gold at 0, 4, 9, closed-book and oracle, forced
    choice, seed 0), on its first `limit` questions."""
    import litm

    return litm.SweepConfig(task="qa", data="generated", num_docs=10, positions=(0, 4, 9), closedbook=True,
                            oracle=True, scoring="choice", limit=limit, seed=0, batch_size=4, progress=False, **kw)


def nb01_config(limit: int, **kw):
    """Notebook 01's default sweep (10 generated key-value pairs, gold at 0, 4, 9, oracle, forced choice)."""
    import litm

    return litm.SweepConfig(task="kv", data="generated", num_docs=10, positions=(0, 4, 9), closedbook=False,
                            oracle=True, scoring="choice", limit=limit, seed=0, batch_size=4, progress=False, **kw)


def scoring(lms: dict, dtypes: list, repeats: int) -> None:
    from litm import runner
    from litm.experiment import load_examples, prompt_for

    print(f"\n## 3. Scoring notebook 02's first batch (questions/s, median of {repeats}, dtypes interleaved)\n")
    print("| scoring | prompt tokens | " + " | ".join(dtypes) + (" | bf16/fp32 |" if len(dtypes) > 1 else " |"))
    print("|---|---:|" + "---:|" * (len(dtypes) + (len(dtypes) > 1)))
    cfg = nb02_config(4)
    examples = load_examples(cfg)
    tok = lms[MODELS[0], dtypes[0]].tokenizer
    prompts = [prompt_for(e, "documents", 4, cfg, tok) for e in examples]
    cands = [runner.candidates(e) for e in examples]
    length = f"{min(len(p.input_ids) for p in prompts)}-{max(len(p.input_ids) for p in prompts)}"
    jobs = {"forced choice": lambda lm: runner.choice(lm, prompts, [c[0] for c in cands], [c[1] for c in cands], 4),
            "log-likelihood": lambda lm: runner.loglik(lm, prompts, [e.answers[0] for e in examples], 4)}
    for name, job in jobs.items():
        med = interleaved_medians({dt: (lambda lm=lms[MODELS[0], dt]: job(lm)) for dt in dtypes}, repeats)
        ratio = f" {med['float32'] / med['bfloat16']:.2f}x |" if len(dtypes) > 1 else ""
        print(f"| {name} | {length} | " + " | ".join(f"{len(prompts) / med[dt]:.2f}" for dt in dtypes) + f" |{ratio}")


def settings(lms: dict, dtypes: list, repeats: int) -> None:
    import torch

    from litm.models import load_model

    n = 2048
    threads = torch.get_num_threads()
    print(f"\n## 4. Settings, SmolLM2-135M prefill of {n} tokens (tokens/s, median of {repeats}, interleaved)\n")
    print("| dtype | setting | tokens/s | against the dtype's default |\n|---|---|---:|---:|")
    ids = torch.randint(10, 40000, (1, n), generator=torch.Generator().manual_seed(1))

    def run(model, nthreads):
        def go():
            torch.set_num_threads(nthreads)
            with torch.inference_mode():
                model.model(input_ids=ids, logits_to_keep=1, use_cache=False)
            torch.set_num_threads(threads)
        return go
    for dt in dtypes:
        lm = lms[MODELS[0], dt]
        eager = load_model(MODELS[0], device="cpu", dtype=dt, attn_implementation="eager", reuse=False)
        # torch.compile (inductor) fuses the norms, rotary embeddings and activations around the products; its
        # first call compiles for this shape, a cost every new prompt length pays again (or a dynamic-shape build)
        compiled = SimpleNamespace(model=torch.compile(load_model(MODELS[0], device="cpu", dtype=dt, reuse=False).model))
        t0 = time.perf_counter()
        run(compiled, threads)()
        first = time.perf_counter() - t0
        med = interleaved_medians({f"SDPA, {threads} threads (the default)": run(lm, threads),
                                   "SDPA, 1 thread": run(lm, 1),
                                   f"eager attention, {threads} threads": run(eager, threads),
                                   f"torch.compile, SDPA, {threads} threads (first call {first:.0f} s)":
                                       run(compiled, threads)}, repeats)
        base = next(iter(med.values()))
        for k, v in med.items():
            print(f"| {dt} | {k} | {n / v:.0f} | {base / v:.2f}x |", flush=True)


def conclusions(dtypes: list, questions: tuple[int, int], results: str) -> None:
    import numpy as np

    from litm import sweep
    from litm.models import load_model
    from litm.planning import middle_penalties
    from litm.runner import dtype_bound
    from litm.stats import t_estimate

    print(f"\n## 6. Conclusions in float32 and bfloat16: notebooks 02 and 01, first {questions[0]} and {questions[1]} "
          "questions\n")
    print("| notebook | records | longest prompt | max margin change | max change / bound | decisions equal "
          "| penalty float32 [95% t] | penalty bfloat16 [95% t] | each interval holds the other's estimate "
          "| seconds per record, float32 / bfloat16 |")
    print("|---|---:|---:|---:|---:|---:|---|---|---|---:|")
    for (name, make), n in zip((("02 (QA)", nb02_config), ("01 (KV)", nb01_config)), questions):
        runs, pens = {}, {}
        for dt in dtypes:
            lm = load_model(MODELS[0], device="cpu", dtype=dt, reuse=False)
            df = sweep(make(n, results_dir=results), lm)  # resumable; the records stay to be read again
            runs[dt] = df.set_index(["condition", "position", "example_id"]).sort_index()
            pens[dt] = t_estimate(middle_penalties(df, "margin"))
        a, b = runs["float32"], runs["bfloat16"].loc[runs["float32"].index]
        change = (a.gold_margin - b.gold_margin).abs()
        size = np.maximum(a.gold_loglik.abs(), (a.gold_loglik - a.gold_margin).abs())  # the two scores compared
        ratio = (change / [dtype_bound(n, s) for n, s in zip(a.prompt_tokens, size)]).max()
        same = float((a.correct == b.correct).mean())
        f, g = pens["float32"], pens["bfloat16"]
        holds = f.low <= g.value <= f.high and g.low <= f.value <= g.high
        print(f"| {name} | {len(a)} | {a.prompt_tokens.max()} | {change.max():.3g} | {ratio:.2f} | {100 * same:.1f}% "
              f"| {f.value:.2f} [{f.low:.2f}, {f.high:.2f}] | {g.value:.2f} [{g.low:.2f}, {g.high:.2f}] "
              f"| {'yes' if holds else 'NO'} | {a.latency_s.mean():.2f} / {b.latency_s.mean():.2f} |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="peak,prefill,scoring,settings,profile", help=f"sections, of {','.join(SECTIONS)}")
    ap.add_argument("--lengths", default="512,2048,4096,8192")
    ap.add_argument("--rows", type=int, default=2048, help="tokens in the matrix products of section 1")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--conclusions", default="60,24", help="questions of notebooks 02 and 01 in section 6")
    ap.add_argument("--results", default="results/cpu-roofline", help="where section 6 keeps its records")
    ap.add_argument("--force-bfloat16", action="store_true", help="run bfloat16 without bfloat16 units (slow)")
    args = ap.parse_args()
    only = args.only.split(",")
    if unknown := set(only) - set(SECTIONS):
        ap.error(f"unknown section(s) {sorted(unknown)}: use {','.join(SECTIONS)}")

    import torch

    from litm.models import cpu_bfloat16_units, cpu_dtype, load_model

    units = cpu_bfloat16_units()
    print(f"CPU: {cpu_flags()}")
    print(f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads; bfloat16 units: {units or 'none'}; "
          f"DTYPE = None gives {cpu_dtype()[0]} ({cpu_dtype()[1]})")
    dtypes = ["float32"]
    if units or args.force_bfloat16:
        dtypes.append("bfloat16")
    else:
        print("This CPU has no bfloat16 matrix units: torch would emulate bfloat16 (30-200x slower than float32 on "
              "a 2-core AVX2 CPU, 3-4x on an AVX-512 one), so bfloat16 is skipped; --force-bfloat16 runs it anyway.")
    lms = {(m, dt): load_model(m, device="cpu", dtype=dt) for m in MODELS for dt in dtypes
           if set(only) & {"peak", "prefill", "scoring", "settings", "profile"}}
    best = {}
    if set(only) & {"peak", "prefill", "profile"}:
        best = peak({m: lms[m, "float32"].text_config for m in MODELS}, dtypes, args.rows, args.repeats)
    if "prefill" in only:
        prefill(lms, dtypes, [int(n) for n in args.lengths.split(",")], args.repeats, best)
    if "scoring" in only:
        scoring(lms, dtypes, args.repeats)
    if "settings" in only:
        settings(lms, dtypes, args.repeats)
    if "profile" in only:
        profile(lms, dtypes, [int(n) for n in args.lengths.split(",")], best)
    if "conclusions" in only:
        if "bfloat16" not in dtypes:
            print("\n## 6. Conclusions: skipped, bfloat16 is not run on this CPU (--force-bfloat16 to run it).")
        else:
            qa, kv = (int(n) for n in args.conclusions.split(","))
            conclusions(dtypes, (qa, kv), args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
