"""What a GPU gives a position sweep, with nothing downloaded: a randomly initialised model of a real
architecture (default on CUDA: the Llama-3-8B shape in bfloat16; on a CPU-only machine it falls back to the
SmolLM2-135M shape in float32, so the script runs and is tested everywhere).

Four measurements, side by side in one run:

1. prefill throughput of one prompt per length, in tokens/s and (model FLOPs: 2 x non-embedding parameters
   per token plus causal attention) as a fraction of the device's dense bf16 peak;
2. batched scoring throughput: log-likelihood passes over left-padded batches (the runner's padding), in
   examples/s per batch size and as a ratio to batch size 1;
3. the attention profile's (`litm.attention.profile`) time and peak memory against a plain forward at each
   length, queries = the question's tokens of a 20-document layout, and (on CUDA) at the longest length,
   doubling up to the model's window, that memory allows;
4. forced choice over the 300 values of the paper's largest KV file (synthetic ids of its size: a prompt of
   about 20k tokens and 300 candidates of 24 tokens): the candidates' pass under the tree mask, its time and
   peak memory against the prompt's prefill.

`--run-tests` first runs the gpu-marked tests (pytest, JUnit XML to build/gpu-tests.xml) and reports each
one's outcome, `--tests FILE` reports those of a JUnit file written before, and `--markdown` writes the whole
report as markdown; the report gives the wall time of the tests, the benchmark and both together.  `make
gpu-check` is `--run-tests --json gpu-check.json --markdown gpu-check.md`, and exits non-zero when a test fails.

Without CUDA and without `--device cpu` it says so in one line and exits with code 3 (NO_CUDA), before any
test or model is run.

    python3 benchmarks/gpu_check.py                      # CUDA: 8B shape at 8k and 32k tokens
    python3 benchmarks/gpu_check.py --device cpu         # small shape at 512 and 1024 tokens, on any machine

Random weights give the real model's speed (the same matrix shapes and kernels), not its answers.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

NO_CUDA = 3  # exit code: no CUDA device and no --device cpu
GPU_TESTS = ("tests/test_gpu.py", "tests/test_bfloat16.py", "tests/test_device_map.py")

SHAPES = {  # published configs of real models (no weights needed)
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=131072,
                      tie_word_embeddings=False),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, rope_theta=100000.0, max_position_embeddings=8192,
                         tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=4096, tie_word_embeddings=False),
}

# Dense (no sparsity) bf16 tensor-core peaks from the vendors' data sheets, in TFLOP/s; first match wins.
PEAK_BF16_TFLOPS = (("GB200", 2500.0), ("B200", 2250.0), ("GH200", 989.0), ("H200", 989.0), ("H100 PCIe", 756.0),
                    ("H100", 989.0), ("H800", 989.0), ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0),
                    ("L4", 121.0), ("RTX 4090", 165.0), ("A6000", 155.0))


def fmt(value, spec: str) -> str:
    """A number formatted, or "n/a" where there is none (no peak memory on a CPU)."""
    return "n/a" if value is None else format(value, spec)


def peak_tflops(device_name: str) -> float | None:
    for key, value in PEAK_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return value
    return None


def build(shape: str, device: str, dtype):
    """A randomly initialised LlamaForCausalLM of `shape`, made directly on `device` in `dtype`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from litm.models import LoadedModel

    torch.manual_seed(0)
    cfg = LlamaConfig(**SHAPES[shape], attn_implementation="sdpa")
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(before)
    from types import SimpleNamespace

    # no tokenizer: the prompts are random ids; the scorer only needs an id to pad with
    return LoadedModel(model, SimpleNamespace(pad_token_id=0), f"random-{shape}", {"kind": "random", "shape": shape})


def flops_per_prefill(cfg, params_non_embedding: int, tokens: int) -> float:
    """Matmul FLOPs of one causal prefill: 2 per non-embedding parameter per token, plus QK^T and AV over
    the lower triangle (2 x T^2 x heads x head_dim per layer); the head of one kept logit is left out."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2.0 * params_non_embedding * tokens + 2.0 * cfg.num_hidden_layers * tokens ** 2 * cfg.num_attention_heads * head_dim


def synthetic_prompt(ids: list[int], docs: int = 20):
    """A Prompt over arbitrary token ids with a 20-document layout: instruction, documents, question."""
    import hashlib

    from litm.prompts import Manifest, Prompt

    n = len(ids)
    lead, tail, q = min(32, n // 8), min(64, n // 8), min(40, n // 10)
    bounds = [lead + (n - lead - tail) * i // docs for i in range(docs + 1)]
    spans = tuple((bounds[i], bounds[i + 1]) for i in range(docs))
    manifest = Manifest(doc_ids=tuple(f"d{i}" for i in range(docs)), doc_spans=spans,
                        doc_char_spans=spans, gold_index=docs // 2, question_spans=((n - tail, n - tail + q),),
                        num_tokens=n, sha256=hashlib.sha256(str(ids).encode()).hexdigest(), template="synthetic",
                        chat=False)
    return Prompt("synthetic", "", tuple(ids), manifest)


class Timer:
    """Wall time and peak memory of a block: CUDA's allocator peak, or none on CPU."""

    def __init__(self, device: str):
        self.device = device

    def __enter__(self):
        import torch

        from litm.models import synchronize

        synchronize(self.device)
        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        import torch

        from litm.models import synchronize

        synchronize(self.device)
        if self.device.startswith("cuda"):
            self.peak_mb = (torch.cuda.max_memory_allocated() - self.base) / 2**20
        else:
            self.peak_mb = None
        self.seconds = time.perf_counter() - self.t0


def timed(device: str, fn, repeats: int):
    """Median seconds and the largest peak memory of `repeats` calls (after one untimed warm-up call)."""
    fn()
    runs = []
    for _ in range(repeats):
        with Timer(device) as t:
            fn()
        runs.append(t)
    peaks = [r.peak_mb for r in runs if r.peak_mb is not None]
    return statistics.median(r.seconds for r in runs), (max(peaks) if peaks else None)


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None,
                    help="cuda or cpu (default: cuda; without CUDA the check stops with exit code 3)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None,
                    help="model shape (default: llama3-8b on CUDA, smollm2-135m on CPU)")
    ap.add_argument("--lengths", default=None, help="prefill and profile lengths (default: 8192,32768 on CUDA, "
                                                    "512,1024 on CPU)")
    ap.add_argument("--score-length", type=int, default=None, help="prompt length for batched scoring "
                                                                   "(default: 2048 on CUDA, 256 on CPU)")
    ap.add_argument("--batches", default=None, help="batch sizes for scoring (default: 1,4,16 on CUDA, 1,4 on CPU)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=None, help="the device's dense bf16 peak, if not known")
    ap.add_argument("--kv", default=None, help="forced choice: prompt tokens, candidates, tokens per candidate "
                                               "(default: 20000,300,24 on CUDA, 512,30,8 on CPU)")
    ap.add_argument("--longest", action=argparse.BooleanOptionalAction, default=None,
                    help="profile at the longest length memory allows (default: on CUDA only)")
    ap.add_argument("--run-tests", action="store_true", help="first run the gpu-marked tests (pytest -m gpu) and "
                                                             "report their outcomes")
    ap.add_argument("--tests", default=None, help="a JUnit XML file of test outcomes to report")
    ap.add_argument("--json", default=None, help="also write the numbers to this file")
    ap.add_argument("--markdown", default=None, help="also write the report as markdown to this file")
    args = ap.parse_args(argv)

    try:
        import torch
        import transformers  # noqa: F401  (the check needs both)
    except ImportError as exc:
        print(f"gpu-check: {sys.executable} has no {exc.name}; run it with a Python that has torch and transformers: "
              "make gpu-check PYTHON=/path/to/python", file=sys.stderr)
        return 2

    from litm.attention import profile
    from litm.runner import _left_pad

    cuda = torch.cuda.is_available()
    if args.device is None and not cuda:
        print(f"gpu-check: torch {torch.__version__} sees no CUDA device, so nothing was run; it needs an NVIDIA GPU "
              "(`--device cpu` runs the benchmark's small CPU version).", file=sys.stderr)
        return NO_CUDA
    device = args.device or "cuda"
    if device.startswith("cuda") and not cuda:
        print("error: --device cuda asked for, but torch sees no CUDA device; `--device cpu` runs the small CPU "
              "version.", file=sys.stderr)
        return 2
    tests_rc, tests_s = 0, None
    if args.run_tests:
        args.tests = str(ROOT / "build" / "gpu-tests.xml")
        Path(args.tests).parent.mkdir(exist_ok=True)
        t = time.perf_counter()
        tests_rc = run_tests(args.tests)
        tests_s = time.perf_counter() - t
    bench_started = time.perf_counter()
    on_gpu = device.startswith("cuda")
    shape = args.shape or ("llama3-8b" if on_gpu else "smollm2-135m")
    dtype = torch.bfloat16 if on_gpu else torch.float32
    lengths = [int(x) for x in (args.lengths or ("8192,32768" if on_gpu else "512,1024")).split(",")]
    score_len = args.score_length or (2048 if on_gpu else 256)
    batches = [int(x) for x in (args.batches or ("1,4,16" if on_gpu else "1,4")).split(",")]
    name = torch.cuda.get_device_name(device) if on_gpu else "CPU"
    peak = args.peak_tflops or (peak_tflops(name) if on_gpu else None)

    t0 = time.perf_counter()
    lm = build(shape, device, dtype)
    cfg = lm.model.config
    params = sum(p.numel() for p in lm.model.parameters())
    embed = lm.model.get_input_embeddings().weight.numel()
    head = 0 if cfg.tie_word_embeddings else lm.model.get_output_embeddings().weight.numel()
    non_embedding = params - embed - head
    print(f"device {name} ({device}), torch {torch.__version__}; model random {shape}: {params / 1e6:,.0f} M "
          f"parameters ({non_embedding / 1e6:,.0f} M non-embedding), {str(dtype).removeprefix('torch.')}, "
          f"built in {time.perf_counter() - t0:.1f} s; bf16 peak "
          f"{f'{peak:.0f} TFLOP/s' if peak else 'unknown (give --peak-tflops)'}", flush=True)
    gen = torch.Generator().manual_seed(0)
    import transformers

    out = {"device": name, "torch": torch.__version__, "transformers": transformers.__version__, "shape": shape,
           "dtype": str(dtype), "parameters": params, "peak_tflops": peak, "prefill": [], "scoring": [], "profile": []}

    print(f"\n1. prefill (one prompt, logits for the last token only; median of {args.repeats})")
    print(f"{'tokens':>7} {'seconds':>9} {'tokens/s':>10} {'TFLOP/s':>9} {'of peak':>8}")
    def plain(x):
        with torch.inference_mode():
            lm.model(input_ids=x, use_cache=False, logits_to_keep=1)

    prompts = {n: torch.randint(0, cfg.vocab_size, (1, n), generator=gen).to(device) for n in lengths}
    for n in lengths:
        sec, mem = timed(device, lambda: plain(prompts[n]), args.repeats)
        tflops = flops_per_prefill(cfg, non_embedding, n) / sec / 1e12
        frac = tflops / peak if peak else None
        out["prefill"].append({"tokens": n, "seconds": sec, "tokens_per_s": n / sec, "tflops": tflops,
                               "fraction_of_peak": frac, "peak_mb": mem})
        print(f"{n:7d} {sec:9.3f} {n / sec:10.0f} {tflops:9.3g} {f'{frac:.0%}' if frac else 'n/a':>8}", flush=True)

    print(f"\n2. batched log-likelihood scoring ({score_len}-token prompts, lengths varied by up to 1/8, left-padded, "
          f"8 answer tokens scored)")
    print(f"{'batch':>6} {'examples/s':>11} {'vs batch 1':>11}")
    base = None
    for b in batches:
        rows = [torch.randint(0, cfg.vocab_size, (score_len - int(torch.randint(0, score_len // 8 + 1, (1,),
                                                                                generator=gen)),),
                              generator=gen).tolist() for _ in range(b)]
        ids, mask, pos = _left_pad(rows, 0, device)

        def score():
            with torch.inference_mode():
                logits = lm.model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=9).logits
                torch.log_softmax(logits.float(), dim=-1)

        sec, _ = timed(device, score, args.repeats)
        rate = b / sec
        base = base or rate
        out["scoring"].append({"batch": b, "examples_per_s": rate, "ratio": rate / base})
        print(f"{b:6d} {rate:11.2f} {rate / base:11.2f}", flush=True)

    print("\n3. attention profile against a plain forward (queries: the question's tokens, 20 documents)")
    print(f"{'tokens':>7} {'plain s':>8} {'profile s':>10} {'time ratio':>11} {'plain MB':>9} {'profile MB':>11} "
          f"{'memory ratio':>13}")
    for n in lengths:
        prompt = synthetic_prompt(prompts[n][0].tolist())
        # timed again beside the profile (not reused from part 1): a ratio of neighbours in time drifts least
        p_sec, p_mem = timed(device, lambda: plain(prompts[n]), args.repeats)
        q_sec, q_mem = timed(device, lambda: profile(lm, prompt, queries="question"), args.repeats)
        mem_ratio = q_mem / p_mem if p_mem else None
        out["profile"].append({"tokens": n, "plain_s": p_sec, "profile_s": q_sec, "time_ratio": q_sec / p_sec,
                               "plain_mb": p_mem, "profile_mb": q_mem, "memory_ratio": mem_ratio})
        print(f"{n:7d} {p_sec:8.3f} {q_sec:10.3f} {q_sec / p_sec:11.2f} {fmt(p_mem, '.0f'):>9} "
              f"{fmt(q_mem, '.0f'):>11} {fmt(mem_ratio, '.2f'):>13}", flush=True)
    if args.longest if args.longest is not None else on_gpu:
        n, longest = max(lengths), None
        while n * 2 <= cfg.max_position_embeddings:
            n *= 2
            ids = torch.randint(0, cfg.vocab_size, (1, n), generator=gen).to(device)
            try:  # one timed run each: at these lengths a run takes seconds
                long_prompt = synthetic_prompt(ids[0].tolist())
                p_sec, p_mem = timed(device, lambda x=ids: plain(x), 1)
                q_sec, q_mem = timed(device, lambda p=long_prompt: profile(lm, p, queries="question"), 1)
            except torch.cuda.OutOfMemoryError:
                break
            finally:
                if on_gpu:
                    torch.cuda.empty_cache()
            longest = {"tokens": n, "plain_s": p_sec, "profile_s": q_sec, "time_ratio": q_sec / p_sec,
                       "plain_mb": p_mem, "profile_mb": q_mem, "memory_ratio": q_mem / p_mem if p_mem else None}
        if longest:
            out["profile"].append({**longest, "longest": True})
            print(f"{longest['tokens']:7d} {longest['plain_s']:8.3f} {longest['profile_s']:10.3f} "
                  f"{longest['time_ratio']:11.2f} {fmt(longest['plain_mb'], '.0f'):>9} "
                  f"{fmt(longest['profile_mb'], '.0f'):>11} {fmt(longest['memory_ratio'], '.2f'):>13}  (longest that "
                  "fits, one run)", flush=True)

    prompt_len, n_cands, cand_len = (int(x) for x in (args.kv or ("20000,300,24" if on_gpu else "512,30,8")).split(","))
    print(f"\n4. forced choice: a {prompt_len}-token prompt, {n_cands} candidates of {cand_len} tokens (on CUDA by "
          "default the 300-key KV file's size), candidates scored side by side under the tree mask")
    from litm.runner import candidate_scores, returned_cache

    kv_ids = torch.randint(0, cfg.vocab_size, (1, prompt_len), generator=gen).to(device)
    cands = [[torch.randint(0, cfg.vocab_size, (cand_len,), generator=gen).tolist() for _ in range(n_cands)]]
    state = {}

    def prefill():
        with torch.inference_mode():
            res = lm.model(input_ids=kv_ids, use_cache=True, logits_to_keep=1)
            state["cache"] = returned_cache(res)
            state["first"] = torch.log_softmax(res.logits[:, -1].float(), -1)

    def candidates():
        candidate_scores(lm, state["cache"], torch.ones((1, prompt_len), dtype=torch.long), state["first"], cands)

    pre_sec, pre_mem = timed(device, prefill, args.repeats)
    cand_sec, cand_mem = timed(device, candidates, args.repeats)
    slots = n_cands * (cand_len - 1)
    out["forced_choice"] = {"prompt_tokens": prompt_len, "candidates": n_cands, "candidate_tokens": cand_len,
                            "slots": slots, "prefill_s": pre_sec, "candidates_s": cand_sec, "prefill_mb": pre_mem,
                            "candidates_mb": cand_mem}
    print(f"prefill {pre_sec:.3f} s, peak {fmt(pre_mem, '.0f')} MB; the candidates' pass ({slots} slots beside the "
          f"prompt's cache) {cand_sec:.3f} s, peak {fmt(cand_mem, '.0f')} MB", flush=True)

    if args.tests:
        out["tests"] = junit_outcomes(args.tests)
        t = out["tests"]
        print(f"\ntests ({args.tests}): {t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped")
    now = time.perf_counter()
    out["seconds"] = {"tests": tests_s, "benchmark": now - bench_started, "total": now - started}
    print(f"wall time: {out['seconds']['total']:.0f} s in all (tests {fmt(tests_s, '.0f')} s, benchmark "
          f"{out['seconds']['benchmark']:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(markdown(out))
    return tests_rc


def run_tests(junit: str) -> int:
    """The gpu-marked tests in a pytest of this interpreter, their outcomes written to `junit`; pytest's exit
    code.  The output goes to this terminal as it comes."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "lib"), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", *GPU_TESTS,
           f"--junitxml={junit}"]
    print("$", " ".join(cmd[2:]), flush=True)
    return subprocess.call(cmd, cwd=ROOT, env=env)


def junit_outcomes(path: str) -> dict:
    """Each test's outcome from a JUnit XML file (pytest's --junitxml), and the counts."""
    import xml.etree.ElementTree as ET

    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        kind = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome":
                      {"failure": "failed", "error": "failed"}.get(kind, kind), "seconds": float(case.get("time", 0))})
    counts = {o: sum(c["outcome"] == o for c in cases) for o in ("passed", "failed", "skipped")}
    return {**counts, "cases": cases}


def markdown(out: dict) -> str:
    """The report as markdown: the machine, the tests' outcomes and the four tables."""
    machine = (f"torch {out.get('torch')}, transformers {out.get('transformers')}; a randomly initialised "
               f"{out['shape']}-shaped model, {out['parameters'] / 1e6:,.0f} M parameters, "
               f"{out['dtype'].removeprefix('torch.')}; bf16 peak {fmt(out['peak_tflops'], '.0f')} TFLOP/s.")
    lines = [f"# GPU check: {out['device']}", "", machine, ""]
    if "seconds" in out:
        sec = out["seconds"]
        lines += [(f"Wall time: {sec['total']:.0f} s in all (tests {fmt(sec['tests'], '.0f')} s, benchmark "
                   f"{sec['benchmark']:.0f} s)."), ""]
    if "tests" in out:
        t = out["tests"]
        lines += [f"## Tests: {t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped", "",
                  "| test | outcome | seconds |", "| --- | --- | ---: |"]
        lines += [f"| `{c['test']}` | {c['outcome']} | {c['seconds']:.1f} |" for c in t["cases"]] + [""]
    lines += ["## Prefill (one prompt, the last token's logits)", "",
              "| tokens | seconds | tokens/s | TFLOP/s | of peak |", "| ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['tokens']} | {r['seconds']:.3f} | {r['tokens_per_s']:,.0f} | {r['tflops']:.3g} | "
              f"{fmt(r['fraction_of_peak'], '.0%')} |" for r in out["prefill"]]
    lines += ["", "## Batched log-likelihood scoring", "", "| batch | examples/s | vs batch 1 |", "| ---: | ---: | ---: |"]
    lines += [f"| {r['batch']} | {r['examples_per_s']:.2f} | {r['ratio']:.2f} |" for r in out["scoring"]]
    lines += ["", "## Attention profile against a plain forward", "",
              "| tokens | plain s | profile s | time ratio | plain MB | profile MB | memory ratio |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['tokens']}{' (longest that fits)' if r.get('longest') else ''} | {r['plain_s']:.3f} | "
              f"{r['profile_s']:.3f} | {r['time_ratio']:.2f} | {fmt(r['plain_mb'], '.0f')} | "
              f"{fmt(r['profile_mb'], '.0f')} | {fmt(r['memory_ratio'], '.2f')} |" for r in out["profile"]]
    fc = out["forced_choice"]
    choice = (f"A {fc['prompt_tokens']}-token prompt and {fc['candidates']} candidates of {fc['candidate_tokens']} "
              f"tokens ({fc['slots']} slots): prefill {fc['prefill_s']:.3f} s, peak {fmt(fc['prefill_mb'], '.0f')} "
              f"MB; the candidates' pass {fc['candidates_s']:.3f} s, peak {fmt(fc['candidates_mb'], '.0f')} MB.")
    lines += ["", "## Forced choice at the 300-key KV file's size", "", choice, ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
