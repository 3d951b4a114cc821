"""`make paper`: the notebooks under a profile (`litm.profiles`) for each of its models, then one table and one
figure per task across the models.

Each run (a notebook, a model, a label) executes through papermill into `notebooks/<profile>/<model>/<label>.ipynb`
with its figures in `figures/<profile>/<model>/<label>/`. Long runs behave: a ledger
(`reports/<profile>/runs.json`) records each finished run with its parameters, seconds and hardware, so a rerun
skips it; a run killed midway resumes from its stored records (`litm.store`); a progress line gives each run's and
the whole job's ETA from the seconds the profile measured, corrected as the job goes. `--shard i/n` runs every
n-th model from the i-th (a job array); `--summary` alone writes the table from what the runs stored.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError
from .profiles import Profile, Run, shipped_defaults

# The paper's own numbers at 20 documents (multi-document QA, NaturalQuestions, generation scored by
# best_subspan_em): GPT-3.5-Turbo (0613) from Liu et al. Table 6 (positions) and Table 1 (closed-book, oracle);
# Llama-2-70b-chat-hf as the paper's repository (nelson-liu/lost-in-the-middle, EXPERIMENTS.md) says you should
# get "approximately" (2,635 questions at 20 documents, 2,655 closed-book and oracle). The paper shows Llama-2-7b,
# 13b and 70b-chat only as a figure (its Figure 16), without numbers.
PUBLISHED = {
    ("qa", 20): [
        {"model": "GPT-3.5-Turbo (0613)", "source": "Liu et al. Tables 6 and 1",
         "positions": {1: 0.758, 5: 0.572, 10: 0.538, 15: 0.554, 20: 0.632}, "closedbook": 0.561, "oracle": 0.883,
         "n": 2655},
        {"model": "Llama-2-70b-chat", "source": "the paper's repository, EXPERIMENTS.md",
         "positions": {1: 0.5677, 5: 0.5332, 10: 0.5408, 15: 0.5966, 20: 0.6949}, "closedbook": 0.3529,
         "oracle": 0.8467, "n": 2635},
    ],
}


def slug(model: str) -> str:
    """A model name as a folder name: a hub id's slash becomes two dashes, a path its last part."""
    p = Path(model)
    return p.name if p.is_absolute() or model.startswith(".") else model.replace("/", "--")


def hardware() -> str:
    """The machine in a few words: the CPU model, its cores and its bfloat16 units, or the emulation torch uses
    without (one model name covers CPUs with and without AMX), and the GPU where torch sees one."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    text = f"{cpu}, {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} cores"
    try:
        import torch

        from .models import cpu_bfloat16_units

        units = cpu_bfloat16_units()
        text += f", {units}" if units else f", bfloat16 emulated ({torch.backends.cpu.get_cpu_capability()})"
        if torch.cuda.is_available():
            text += f", {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return text


@dataclass(frozen=True)
class Job:
    """One run of one model: where its copy, figures and reports go, its parameters, and the values the profile
    sets in its notebook (the digest is of both, so a run whose values change runs again)."""

    model: str
    run: Run
    parameters: dict
    source: Path  # the notebook
    executed: Path  # its executed copy
    settings: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.model}/{self.run.label}"

    @property
    def digest(self) -> str:
        values = {**self.settings, **self.parameters}
        return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _window(model: str) -> int | None:
    from .models import REGISTRY

    return REGISTRY[model].window if model in REGISTRY else None


def jobs(prof: Profile, models=None, only=None, shard=None, overrides=None, root=".", out=None
         ) -> tuple[list[Job], list[str]]:
    """The runs to make, in order (the table's sweeps first, each on every model, so that a long job fills the
    table as it goes; then the other runs model by model), and what is skipped and why. The notebooks are
    read from `root`/notebooks; executed copies, figures and reports go under `out` (default `root`):
    notebooks/<profile>/<model>/<label>.ipynb, figures/<profile>/<model>/<label>/, reports/<profile>/<model>/<label>/."""
    from .notebooks import declared

    from .models import check_name

    models = list(models or prof.models)
    if not models:
        raise ConfigError(f"profile {prof.name!r} names no models; give --models.")
    for m in models:
        check_name(m)
    unmatched = [o for o in only or () if not any(o in (r.notebook, r.label) for r in prof.runs)]
    if unmatched and prof.runs:  # a profile without runs of its own (course) has nothing to match
        raise ConfigError(f"--only {', '.join(unmatched)}: no run of the {prof.name} profile has that notebook number "
                          f"or label; its runs are {', '.join(r.label for r in prof.runs)}.")
    first = models[0]  # a run made once (`per_model=False`) is made with the first model, in shard 0
    if shard is not None:
        i, n = shard
        models = models[i::n]
    notebooks = Path(root) / "notebooks"
    base = Path(out or root)
    todo, skipped, used = [], [], set()
    for m in models:
        for run in prof.runs:
            if only and run.notebook not in only and run.label not in only:
                continue
            if not run.per_model and m != first:
                continue
            window = _window(m)
            if run.window and window is not None and window < run.window:
                skipped.append(f"{run.label} on {m}: needs a window of about {run.window:,} tokens, {m} has "
                               f"{window:,}")
                continue
            found = sorted(notebooks.glob(f"{run.notebook}-*.ipynb"))
            if not found:
                raise ConfigError(f"no notebook {run.notebook}-*.ipynb under {notebooks}; run from the repository.")
            declared_names = declared(found[0])
            folder = Path(prof.name) / slug(m) / run.label
            where = {"FIGURES_DIR": base / "figures" / folder, "REPORT_DIR": base / "reports" / folder}
            params = {"PROFILE": prof.name, "MODEL": m, **run.parameters, **run.by_model.get(m, {}),
                      **{k: os.path.relpath(v, notebooks) for k, v in where.items() if k in declared_names}}
            for key, value in (overrides or {}).items():  # NAME: every notebook declaring it; "NN.NAME": notebook NN
                nb, _, name = key.rpartition(".")
                if name in declared_names and nb in ("", run.notebook):
                    params[name] = value
                    used.add(key)
            for key in ("DATA", "CASES"):  # a data file the run reads must be there before anything starts
                value = params.get(key, prof.settings.get(run.notebook, {}).get(key, declared_names.get(key)))
                if isinstance(value, str) and value != "generated" and not (notebooks / value).is_file():
                    raise ConfigError(f"{run.label} reads {key} = {value} (from the notebooks folder), which is not "
                                      "there" + (": fetch the paper's data with `python -m litm fetch liu2023`."
                                                 if "liu2023" in value else "; give a file that exists."))
            todo.append(Job(m, run, params, found[0], base / "notebooks" / folder.parent / f"{run.label}.ipynb",
                            prof.settings.get(run.notebook, {})))
    tabled = [label for _, _, label in prof.tables]
    todo.sort(key=lambda j: (tabled.index(j.run.label), models.index(j.model)) if j.run.label in tabled
              else (len(tabled), models.index(j.model)))  # stable: the other runs keep the profile's order
    unused = sorted(set(overrides or {}) - used)
    if unused and todo:
        raise ConfigError(f"no run declares {', '.join(unused)}: a parameter is NAME (every notebook that declares "
                          "it) or NN.NAME (notebook NN only), as the notebooks' config cells spell it.")
    return todo, skipped


EMULATED_MIN = 0.1  # emulated bfloat16 at least this share of float32's speed: a bfloat16 run continues there


def check_dtype(prof: Profile, todo: list[Job]) -> None:
    """Stop before anything runs where a run the profile pins to bfloat16 would run on a CPU that emulates bfloat16
    too slowly. Without bfloat16 units torch emulates them; how slowly depends on the CPU, so a product is timed
    (`models.bfloat16_speedup`): on a 2-core AVX2 EPYC emulated bfloat16 ran at 0.004-0.04x float32's speed
    (docs/cpu.md), and a float32 run instead would start new records beside the committed bfloat16 ones rather
    than continue them; on a 2-core AVX-512 Xeon it ran at 0.22-0.29x, a Gemma record in 1.3-1.7x the seconds of an
    AVX512-BF16 EPYC's, so there the runs continue, with a note (docs/paper.md)."""
    pinned = [j.key for j in todo if j.parameters.get("DTYPE", j.settings.get("DTYPE")) == "bfloat16"]
    if not pinned:
        return
    import torch

    from .models import BF16_CHECK_SHAPE, bfloat16_speedup, cpu_bfloat16_units

    if torch.cuda.is_available() or cpu_bfloat16_units():
        return
    ratio, shape = bfloat16_speedup(), "x".join(map(str, BF16_CHECK_SHAPE))
    emulated = (f"this CPU has no bfloat16 units (torch: {torch.backends.cpu.get_cpu_capability()}), so torch "
                f"emulates them: a {shape} product ran at {ratio:.3g}x float32's speed in bfloat16")
    if ratio >= EMULATED_MIN:
        print(f"Note: {emulated}, so the {prof.name} profile's bfloat16 runs go on here, slower than on a CPU with "
              "units (docs/paper.md).", file=sys.stderr)
        return
    raise ConfigError(f"the {prof.name} profile runs in bfloat16 ({', '.join(pinned[:3])}"
                      f"{' ...' if len(pinned) > 3 else ''}), and {emulated} (below {EMULATED_MIN}x). Run it on a "
                      "CPU with AMX or AVX512-BF16 (`lscpu` lists amx_bf16 or avx512_bf16) or on a GPU; or add "
                      "`-p DTYPE float32` for float32 runs of your own, which start new records beside the "
                      "committed bfloat16 ones instead of continuing them.")


class Ledger:
    """`runs.json`: each finished run with its parameters' digest, seconds, hardware and time. Each record rereads
    the file under a lock and writes it whole through a temporary file, so the jobs of an array share one ledger
    and no job's entry is lost. A run stopped part way (Ctrl-C, a batch system's SIGTERM) leaves its seconds so
    far (and the records it stored, `partial_records`, for the rerun's ETA); its finished entry's `seconds` add up
    every attempt (`attempts` counts them), and `hardware` names each machine an attempt ran on.  A running run
    saves its seconds every few minutes too (`run_jobs`), so one killed outright (SIGKILL, a machine taken away)
    loses only the minutes since its last save."""

    def __init__(self, path: Path):
        self.path = Path(path).absolute()  # papermill runs a notebook from its folder: saves while it runs go here
        self.entries = self._read()

    def _read(self) -> dict:
        return json.loads(self.path.read_text()) if self.path.is_file() else {}

    def spent(self, job: Job) -> float:
        """The seconds earlier attempts of this unfinished run (same digest) have saved, 0 for a new one."""
        e = self.entries.get(job.key, {})
        return float(e.get("partial_seconds", 0.0)) if e.get("digest") == job.digest and "seconds" not in e else 0.0

    def stored(self, job: Job) -> int | None:
        """The records earlier attempts of this unfinished run have stored, 0 for a new one; None where they were
        not counted (an entry saved before the ledger counted them)."""
        e = self.entries.get(job.key, {})
        if e.get("digest") != job.digest or "seconds" in e or not e.get("partial_seconds"):
            return 0
        return e.get("partial_records")

    def done(self, job: Job) -> bool:
        e = self.entries.get(job.key)
        return bool(e) and "seconds" in e and e.get("digest") == job.digest and job.executed.is_file()

    def record(self, job: Job, seconds: float, finished: bool = True, new_attempt: bool = True,
               running: bool = False, records: int = 0) -> None:
        """Add `seconds` (and the `records` stored in them) to the job's entry; `new_attempt` False: more of an
        attempt already counted; `running`: a save while it runs (the entry's `running` is then the time it was
        last seen running, `stopped` the time it stopped)."""
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.entries = {**self.entries, **self._read()}
            before = self.entries.get(job.key, {})
            if before.get("digest") != job.digest or "seconds" in before:  # another run's, or a finished one
                before = {}
            spent, attempts = before.get("partial_seconds", 0.0) + seconds, before.get("attempts", 0) + new_attempt
            hosts = [h for h in before.get("hardware", "").split("; ") if h]  # a run resumed elsewhere names both
            here = hardware()
            hosts += [here] if here not in hosts else []
            if finished:
                entry = {"seconds": round(spent, 1), "attempts": attempts,
                         "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
            else:
                counted = before.get("partial_records", 0 if not before else None)  # None: not counted before
                entry = {"partial_seconds": round(spent, 1), "attempts": attempts,
                         **({"partial_records": counted + records} if counted is not None else {}),
                         "running" if running else "stopped": time.strftime("%Y-%m-%d %H:%M:%S")}
            self.entries[job.key] = {"digest": job.digest, **entry, "hardware": "; ".join(hosts),
                                     "notebook": str(job.executed),
                                     "parameters": {k: repr(v) for k, v in job.parameters.items()}}
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.entries, indent=1, sort_keys=True) + "\n")
            tmp.replace(self.path)


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h} h {rest // 60:02d} min" if h else f"{rest // 60} min {rest % 60:02d} s"


def _span(low: float, high: float) -> str:
    """An ETA: one time, or the range from the fewest questions' guess to the cap's ("up to" once past the first)."""
    if _clock(low) == _clock(high):
        return _clock(low)
    return f"up to {_clock(high)}" if low <= 0 else f"{_clock(low)} to {_clock(high)}"


class Records:
    """How many records the results folders under `roots` hold now (each file recounted only when it has grown);
    with `model`, only the folders whose manifest names that model, so the jobs of an array (a model each) sharing
    one results folder do not count each other's records (a folder of another model a run makes, notebook 07's
    second model's, is not counted either)."""

    def __init__(self, roots, model: str | None = None):
        self.roots, self.model, self._seen, self._ours = [Path(r) for r in roots], model, {}, {}

    def _counts(self, f: Path) -> bool:
        if self.model is None:
            return True
        if f not in self._ours:
            try:
                self._ours[f] = json.loads((f.parent / "manifest.json").read_text())["config"]["model"] == self.model
            except (OSError, ValueError, KeyError, TypeError):  # not written yet, or not a litm manifest
                return False
        return self._ours[f]

    def __call__(self) -> int:
        files = {f for r in self.roots if r.is_dir() for f in r.rglob("records.jsonl") if self._counts(f)}
        for f in files:
            size = f.stat().st_size
            if self._seen.get(f, (None,))[0] != size:
                with open(f, "rb") as fh:
                    self._seen[f] = (size, sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b"")))
        return sum(self._seen[f][1] for f in files)


class Progress:
    """One line on stderr, redrawn every few seconds: the run in progress with its ETA, and the whole job's.

    A run's expected seconds come from the profile's measured times: one number, or (fewest, most) where the
    run's size is its pilot's plan, between the fewest questions the profile allows and its cap, so the ETA is a
    range (unknown runs count as the mean of the known, or 10 minutes). As runs finish, every estimate is scaled by
    how long the finished runs took against their range (below it: against its low end; above: its high end; inside:
    as expected), so the ETA learns this machine's speed. Once the run in progress has stored `LIVE_AFTER` records
    and its expected seconds a record are known (`per_record`), its own pace sets that scale instead: a run that
    takes hours corrects its ETA within minutes. A resumed run's `earlier` seconds (its earlier attempts', from the
    ledger) count as spent on it. Once the run's pilot has planned its size, the plan's file (`plans`, the job's
    key to the path given the notebook as `planning.PLAN_FILE`) turns its range into one time: the records it
    will store at the expected seconds a record, or, where those are not known, the plan's own seconds. Where
    the ledger counted the records its earlier attempts stored (`stored`), the run's ETA is the records still to
    store at this attempt's own pace (once `LIVE_AFTER` are stored; until then the expected seconds a record, or
    the plan's), so a resumed run's ETA does not hang on its earlier attempts having run at today's pace."""

    LIVE_AFTER = 10

    def __init__(self, todo: list[Job], expected: dict, stream=sys.stderr, every: float | None = None,
                 records=None, earlier: dict | None = None, per_record: dict | None = None,
                 stored: dict | None = None):
        spans = {k: (v, v) if isinstance(v, (int, float)) else tuple(v) for k, v in expected.items()}
        known = [spans[j.key] for j in todo if j.key in spans]
        default = tuple(sum(s[i] for s in known) / len(known) for i in (0, 1)) if known else (600.0, 600.0)
        self.expected = {j.key: spans.get(j.key, default) for j in todo}
        # a terminal gets one line redrawn every 5 s; a log file (a batch job's) a new line a minute
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.todo, self.stream, self.every = todo, stream, every or (5.0 if self.tty else 60.0)
        self.spent = self.planned = 0.0  # seconds taken and expected by the finished runs
        self.current: Job | None = None
        self.started = self.job_start = time.perf_counter()
        self.records, self.records_before = records, 0  # `records()`: records stored now (a `Records`)
        self.earlier = {k: v for k, v in (earlier or {}).items() if v > 0}
        self.per_record = {k: v for k, v in (per_record or {}).items() if v > 0}
        self.stored = {k: v for k, v in (stored or {}).items() if v is not None}  # None: not counted
        self.plans: dict = {}  # a job's key -> the file its plan is written to (read once, then dropped)
        self.told: dict = {}  # a job's key -> what its plan said (records, seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)

    def ratio(self) -> float:
        return self.spent / self.planned if self.planned else 1.0

    def _read_plan(self) -> None:
        key = self.current.key if self.current else None
        try:
            told = json.loads(Path(self.plans[key]).read_text())
        except (KeyError, OSError, ValueError):  # none asked for, or not planned yet
            return
        del self.plans[key]
        self.told[key] = told
        if self.per_record.get(key) and told.get("records"):
            self.expected[key] = (told["records"] * self.per_record[key],) * 2
        elif told.get("seconds"):  # this machine's seconds: as a guess, they are scaled back by the learnt speed
            self.expected[key] = (told["seconds"] / self.ratio(),) * 2

    def made(self) -> int:
        """The records stored since the run in progress started."""
        return self.records() - self.records_before if self.records else 0

    def line(self) -> str:
        if self.current is None:
            return ""
        self._read_plan()
        key = self.current.key
        now = time.perf_counter()
        in_run = now - self.job_start
        made = self.made()
        live = self.per_record.get(key)
        r = in_run / made / live if live and made >= self.LIVE_AFTER else self.ratio()
        before = self.earlier.get(key, 0.0)
        run = [max(0.0, self.expected[key][k] * r - before - in_run) for k in (0, 1)]
        told = self.told.get(key, {})
        if told.get("records") and key in self.stored:  # the records still to store, at this attempt's pace
            pace = (in_run / made if made >= self.LIVE_AFTER else live * self.ratio() if live
                    else told.get("seconds", math.nan) / told["records"])
            if pace == pace:
                run = [max(0.0, told["records"] - self.stored[key] - made) * pace] * 2
        i = self.todo.index(self.current)
        left = [run[k] + sum(max(0.0, self.expected[j.key][k] * r - self.earlier.get(j.key, 0.0))
                             for j in self.todo[i + 1:]) for k in (0, 1)]
        return (f"[{i + 1}/{len(self.todo)}] {self.current.key}: {_clock(in_run)} in"
                + (f" (+ {_clock(before)} in earlier attempts)" if before else "") + f", ETA {_span(*run)}; "
                f"whole run {_clock(now - self.started)} in, ETA {_span(*left)}"
                + (f"; {made} records stored in this run, {in_run / made:.0f} s each" if made > 0 else ""))

    def _tick(self):
        while not self._stop.wait(self.every):
            print(("\r" if self.tty else "") + self.line(), end="" if self.tty else "\n", file=self.stream, flush=True)

    def start(self, job: Job):
        self.records_before = self.records() if self.records else 0
        self.current, self.job_start = job, time.perf_counter()
        if not self._thread.is_alive():
            self._thread.start()
        print(self.line(), file=self.stream, flush=True)

    def finish(self, job: Job, seconds: float):
        self._read_plan()  # the run's size, where it planned one and no line has read it yet
        self.spent += seconds
        low, high = self.expected[job.key]  # a run inside its range says nothing of the machine's speed
        self.planned += min(max(seconds, low), high)
        self.current = None
        print(("\r" if self.tty else "") + f"{job.key}: done in {_clock(seconds)}" + " " * (40 if self.tty else 0),
              file=self.stream, flush=True)

    def close(self):
        self._stop.set()


class _Clock:
    """A running job's seconds, saved to the ledger as it starts, every `every` seconds and when it ends (each
    save adds the seconds since the last; the first counts the attempt)."""

    def __init__(self, ledger: Ledger, job: Job, every: float, made):
        self.ledger, self.job, self.t0, self.saved = ledger, job, time.perf_counter(), 0.0
        self.made, self.saved_records = made, 0  # `made()`: the records this attempt has stored so far
        self.counted = self.ended = False
        self._lock, self._stop = threading.Lock(), threading.Event()
        self.save(finished=False, last=False)  # in the ledger from its first second: its records so far are no row
        self._thread = threading.Thread(target=self._tick, args=(every,), daemon=True)
        self._thread.start()

    def _tick(self, every):
        while not self._stop.wait(every):
            self.save(finished=False, last=False)

    def save(self, finished: bool, last: bool = True) -> None:
        with self._lock:
            if self.ended:
                return
            spent, made = time.perf_counter() - self.t0, self.made()
            self.ledger.record(self.job, spent - self.saved, finished=finished, new_attempt=not self.counted,
                               running=not last, records=made - self.saved_records)
            self.saved, self.saved_records, self.counted, self.ended = spent, made, True, last
        if last:
            self._stop.set()


# How many times as long a question takes as on the 2-core Xeon with AMX that the profile's seconds come from:
# AVX512-BF16 alone (a 2-core AMD EPYC) took 118 s a key-value question at 75 pairs against 38.4 (3.1x) and 2.4-3.1x
# a course notebook's; float32 without bfloat16 units (AVX2) answered notebook 02's questions 6.9x slower
# (docs/cpu.md). The ETA's first guess; it learns the rest as runs finish.
SLOWER = {"AMX": 1.0, "AVX512-BF16": 3.0, "": 6.9}  # "": no bfloat16 units


def machine_factor() -> tuple[float, str]:
    """This machine's factor from `SLOWER`, and what it rests on (a GPU: 1, the CPU's seconds as they are)."""
    import torch

    from .models import cpu_bfloat16_units

    if torch.cuda.is_available():
        return 1.0, "a GPU (the CPU's seconds as they are)"
    units = cpu_bfloat16_units() or ""
    known = [name for name in SLOWER if name and name in units] or ([""] if not units else [])
    if not known:
        return 1.0, f"{units}: not measured, so the seconds measured on a 2-core Xeon with AMX as they are"
    factor = SLOWER[known[0]]
    return factor, f"{units or 'no bfloat16 units'}: {factor:g}x the seconds measured on a 2-core Xeon with AMX"


def run_jobs(prof: Profile, todo: list[Job], ledger: Ledger, progress: bool = True, save_every: float = 300.0) -> dict:
    """Execute each job not in the ledger (same parameters), recording each as it finishes (and its seconds so
    far every `save_every` seconds while it runs)."""
    from .notebooks import execute
    from .planning import PLAN_FILE

    def stop(signum, frame):  # a batch system's SIGTERM unwinds like Ctrl-C: the run's seconds so far are kept
        raise SystemExit(128 + signum)

    pending = [j for j in todo if not ledger.done(j)]
    for j in todo:
        if j not in pending:
            print(f"{j.key}: done before ({ledger.entries[j.key]['seconds']:.0f} s), skipped", file=sys.stderr)
    stream = sys.stderr if progress else open(os.devnull, "w")
    factor, why = machine_factor() if pending and prof.seconds else (1.0, "")
    if why:
        print(f"ETA: {why}", file=stream)
    roots = {(j.source.parent / folder).resolve() for j in pending
             if (folder := j.parameters.get("RESULTS_DIR", j.settings.get("RESULTS_DIR")))}
    bar = Progress(pending, {k: tuple(factor * x for x in (v if isinstance(v, tuple) else (v, v)))
                             for k, v in prof.seconds.items()}, stream=stream,
                   earlier={j.key: ledger.spent(j) for j in pending},
                   per_record={k: factor * v for k, v in prof.per_record.items()},
                   stored={j.key: ledger.stored(j) for j in pending})
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, stop) if main else None
    told = tempfile.TemporaryDirectory(prefix="litm-plans-")
    try:
        for n, j in enumerate(pending):
            bar.plans[j.key] = os.environ[PLAN_FILE] = str(Path(told.name) / f"{n}.json")
            bar.records = Records(roots, j.model)
            bar.start(j)
            clock = _Clock(ledger, j, save_every, bar.made)
            # papermill writes the copy as it goes: it takes the run's name only once the run has finished
            running = j.executed.with_suffix(".running.ipynb")
            try:
                execute(j.source, j.executed.parent, j.parameters, timeout=None, rebase_links=True,
                        name=running.name)
            except BaseException:  # stopped or failed: its records stay, and so do its seconds, for the rerun
                if running.is_file():  # what it printed up to there, traceback included (git ignores it)
                    running.replace(j.executed.with_suffix(".stopped.ipynb"))
                clock.save(finished=False)
                raise
            running.replace(j.executed)
            clock.save(finished=True)
            bar.finish(j, ledger.entries[j.key]["seconds"])
    finally:
        bar.close()
        os.environ.pop(PLAN_FILE, None)
        told.cleanup()
        if main:
            signal.signal(signal.SIGTERM, previous)
    return ledger.entries


# ----------------------------------------------------------------------------- the summary
def _pick(reports, model: str, task: str, size: int):
    """The sweep of `model` at (task, size) with the most paired questions (the study's, not its pilot's)."""
    found = [r for r in reports if r.config.get("model") == model and r.config.get("task") == task
             and r.config.get("num_docs") == size]
    return max(found, key=lambda r: r.n_questions) if found else None


def _cell(m, value, low=None, high=None) -> str:
    if value is None or value != value:
        return "n/a"
    if m.binary:
        text = f"{100 * value:.0f}%"
        return text + (f" [{100 * low:.0f}, {100 * high:.0f}]" if low is not None else "")
    return f"{value:+.2f}" + (f" [{low:+.2f}, {high:+.2f}]" if low is not None else "")


def equivalence_p(estimate, margin: float) -> float:
    """TOST p that a t estimate (value, 95% t interval, n) lies within +-margin, from its standard error."""
    from scipy.stats import t

    from .stats import t_se

    df, se = estimate.n - 1, t_se(estimate)
    if se == 0:
        return 0.0 if abs(estimate.value) < margin else 1.0
    return float(max(t.sf((estimate.value + margin) / se, df), t.cdf((estimate.value - margin) / se, df)))


def _reading(estimate, m, smallest: float) -> str:
    """What a primary middle penalty says against the smallest effect of interest (as `planning.conclusion`)."""
    if estimate.low > 0 or estimate.high < 0:
        return "excludes 0"
    from .stats import equivalence_bound

    p, bound = equivalence_p(estimate, smallest), m.format(equivalence_bound(estimate))
    return (f"within +-{m.format(smallest)} (TOST p = {p:.2g}; rules out beyond +-{bound})" if p < 0.05
            else f"cannot tell from +-{m.format(smallest)} (TOST p = {p:.2g}); rules out only beyond +-{bound}")


def _rows(report, wall: str, primary: str | None = None, smallest: float | None = None) -> list[list[str]]:
    """One row per measure (accuracy, then the margin where held): each gold position, closed-book, oracle, the
    middle penalty with its t interval and p (for the study's primary measure, read against its smallest effect
    of interest), n, the wall time."""
    from . import stats

    s = report.summary
    rows = []
    for name in ("accuracy", "margin"):
        m = stats.measure(name)
        if m.summary[0] not in s:
            continue
        y, lo, hi = m.summary
        docs = s[s["condition"] == "documents"].sort_values("position")
        cells = [_cell(m, r[y], r[lo], r[hi]) for _, r in docs.iterrows()]
        for cond in ("closedbook", "oracle"):
            row = s[s["condition"] == cond]
            cells.append(_cell(m, row[y].iloc[0]) if len(row) else "n/a")
        effect = next((e for e in report.effects if e.measure.name == name), None)
        if effect is None:
            penalty = "n/a"
        else:
            e = effect.estimate
            penalty = (f"{m.format(e.value, True)} [{m.format(e.low, True)}, {m.format(e.high, True)}] {m.unit}, "
                       f"p = {e.p_value:.2g}")
            if name == primary and smallest:
                penalty += f"; {_reading(e, m, smallest)}"
        n = effect.estimate.n if effect else report.n_questions
        rows.append([report.config.get("model"), f"{m.label.split(' over')[0]}" + (" (nats)" if not m.binary else ""),
                     *cells, penalty, str(n), wall])
    return rows


class NothingToTable(ConfigError):
    """No finished sweep at the profile's shapes in the results yet."""


def table(results, prof: Profile, ledger: Ledger, models=None) -> tuple[str, list, "pd.DataFrame"]:
    """The README table: for each (task, size) of the profile, each model's accuracy and margin at every gold
    position with 95% intervals (Wilson; t), closed-book and oracle, the middle penalty (t interval over questions,
    t-test p), n and the wall time of the run that made it (at least the records' scoring seconds); the paper's
    published numbers beside QA at 20 documents. A run the ledger has as unfinished is named below the table, not
    put in it. `results`: a results folder, or the records `report.load_results` read from one; `models` (a run's
    `--models`) adds to the profile's, never hides them, so a run of one model keeps the others' finished rows.
    Returns the markdown, the sweeps used and their per-position long table (`report.to_table`)."""
    from .report import analyse, load_results, to_table

    df = load_results(results) if isinstance(results, (str, Path)) else results
    reports = analyse(df)
    models = list(dict.fromkeys([*prof.models, *(models or [])]))
    text, used, under_way, hosts = [], [], [], []
    for task, size, label in prof.tables:
        what = "Multi-document QA" if task == "qa" else "Key-value retrieval"
        unit = "documents" if task == "qa" else "key-value pairs"
        found = [(m, _pick(reports, m, task, size)) for m in models]
        found = [(m, r) for m, r in found if r is not None]
        # a run still under way (its ledger entry unfinished) holds part of its sweep: not a row of the table
        unfinished = [m for m, _ in found if "seconds" not in ledger.entries.get(f"{m}/{label}", {"seconds": None})]
        under_way += [f"{m} at {size} {unit}" for m in unfinished]
        found = [(m, r) for m, r in found if m not in unfinished]
        if not found:
            continue
        positions = sorted(int(p) + 1 for p in found[0][1].summary.query("condition == 'documents'")["position"])
        head = ["model", "measure", *[f"gold at {p}" for p in positions], "closed-book", "oracle",
                "middle penalty", "n", "wall time"]
        lines = [f"**{what}, {size} {unit}** ({found[0][1].config.get('scoring')} scoring)", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        run = next(x for x in prof.runs if x.label == label)
        planned = {**shipped_defaults(run.notebook), **prof.settings.get(run.notebook, {}), **run.parameters}
        for m, r in found:
            entry = ledger.entries.get(f"{m}/{label}")
            hosts += [h for h in (entry or {}).get("hardware", "").split("; ") if h and h not in hosts]
            # the records' own scoring seconds bound the wall time from below: above the ledger's, an attempt was
            # killed before it could save its seconds, and the bound is what can be stated
            scoring = df.loc[df["config_hash"].isin(r.runs), "latency_s"].sum() if "latency_s" in df else 0.0
            wall = "n/a" if not entry or "seconds" not in entry else (
                _clock(entry["seconds"]) if entry["seconds"] >= scoring else f"≥ {_clock(scoring)}")
            dtype = r.config.get("dtype")
            rows = _rows(r, wall, planned.get("PRIMARY"), planned.get("SMALLEST"))
            for i, row in enumerate(rows):
                if i:  # the model's second measure: named on its first row; n and wall time only where they differ
                    row[0] = ""
                    row[-2:] = ["" if a == b else a for a, b in zip(row[-2:], rows[0][-2:])]
                elif dtype:
                    row[0] = f"{row[0]} ({dtype})"
                lines.append("| " + " | ".join(row) + " |")
            used.append(r)
        for p in PUBLISHED.get((task, size), []):
            if [int(k) for k in p["positions"]] != positions:
                continue
            edges = (p["positions"][positions[0]] + p["positions"][positions[-1]]) / 2
            middle = p["positions"][positions[len(positions) // 2]]
            cells = [f"{100 * p['positions'][k]:.1f}%" for k in positions]
            lines.append("| " + " | ".join([f"{p['model']}, published ({p['source']})", "accuracy (generation, NQ)",
                                            *cells, f"{100 * p['closedbook']:.1f}%", f"{100 * p['oracle']:.1f}%",
                                            f"{100 * (edges - middle):+.1f} points",
                                            str(p["n"]), ""]) + " |")
        text.append("\n".join(lines))
    if not text:
        raise NothingToTable(f"no finished sweep of {', '.join(models)} at the profile's shapes in the results"
                             + (f" (under way: {'; '.join(under_way)})" if under_way else "")
                             + "; run `make paper` (or `python -m litm paper`) first.")
    if under_way:
        text.append(f"Under way, not in the table until they finish: {'; '.join(under_way)}.")
    text.append(f"Hardware: {'; '.join(hosts) or 'not recorded'}. 95% intervals: Wilson (accuracy), t over questions "
                "(margins; middle penalty = edges minus middle, paired t-test p). The primary penalty excludes 0, lies "
                "within the smallest effect of interest (TOST), or neither. Wall time: all attempts (≥: the records' "
                "scoring seconds, where a killed attempt lost its time).")
    return "\n\n".join(text) + "\n", used, to_table(used)


def overlay_figures(df, used, prof: Profile, out_dir) -> list[Path]:
    """One figure per task, as the paper draws its models: a column per size, accuracy above the margin, a line
    per model, each the sweep the table used (`used`, from `table`) out of the records `df`."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from .plots import position_curve, save_figure

    written = []
    for task in dict.fromkeys(t for t, _, _ in prof.tables):
        parts = []
        for _, size, _ in [x for x in prof.tables if x[0] == task]:
            ids = [r.sweep_id for r in used if r.config.get("task") == task and r.config.get("num_docs") == size]
            if ids:
                parts.append((size, pd.concat(df[df["sweep_id"] == i] for i in ids)))
        if not parts:
            continue
        rows = 2 if any("gold_margin" in g and g["gold_margin"].notna().any() for _, g in parts) else 1
        fig, axes = plt.subplots(rows, len(parts), figsize=(4.6 * len(parts), 3.9 * rows), squeeze=False)
        unit = "document" if task == "qa" else "key-value pair"
        for j, (size, g) in enumerate(parts):
            for i in range(rows):
                position_curve(g, label_by="model", ax=axes[i][j], measure="margin" if i else None, unit=unit,
                               title=f"{size} {unit}s" if i == 0 else None)
        handles = {}
        for a in axes.flat:  # one legend for the figure: a line per model, and the baselines
            for h, label in zip(*a.get_legend_handles_labels()):
                handles.setdefault(label, h)
            if a.get_legend():
                a.get_legend().remove()
        fig.suptitle(("Multi-document QA" if task == "qa" else "Key-value retrieval") + f" ({prof.name} profile)")
        ncol = 2 if len(parts) == 1 else 3  # a legend no wider than the panels
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol, frameon=False)
        legend_inches = 0.1 + 0.22 * -(-len(handles) // ncol)  # its rows of entries
        fig.tight_layout(rect=(0, legend_inches / fig.get_figheight(), 1, 1))
        written += save_figure(fig, f"{task}-position-curves", out_dir)
        plt.close(fig)
    return written


def summarize(prof: Profile, results_dir, reports_dir, figures_dir, models=None, readme=None) -> str:
    """The table (`table.md`), the report of the sweeps it uses (report.md, .tex, .csv) and the overlay figures;
    with `readme`, the table also replaces the block between `<!-- paper-table -->` markers there."""
    from .report import load_results, write_report

    ledger = Ledger(Path(reports_dir) / "runs.json")
    df = load_results(results_dir)
    text, used, _ = table(df, prof, ledger, models)
    out = Path(reports_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(text)
    folders = [Path(results_dir) / h for r in used for h in r.runs]
    write_report(folders, out)
    figures = overlay_figures(df, used, prof, figures_dir)
    if readme:
        path = Path(readme)
        marker = "<!-- paper-table -->"
        body = path.read_text()
        if body.count(marker) != 2:
            raise ConfigError(f"{path} needs two {marker} lines around the table's place.")
        head, _, rest = body.partition(marker)
        _, _, tail = rest.partition(marker)
        path.write_text(f"{head}{marker}\n{text}{marker}{tail}")
    print(f"wrote {out / 'table.md'}, {out / 'report.md'} (.tex, .csv) and {len(figures)} figure files in "
          f"{figures_dir}", file=sys.stderr)
    return text
