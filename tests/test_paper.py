"""Profiles and `make paper`: what a profile sets, the runs it makes, the ledger that resumes them, the ETA, and the
table and figures from stored records."""
import dataclasses
import json
import os
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from litm import SweepConfig, paper, planning, profiles
from litm.cli import main
from litm.errors import ConfigError
from litm.experiment import Sweep
from litm.notebooks import declared
from litm.store import ResultStore
from litm.study import config_hash

from conftest import ROOT

IDENTITY = {"weights": {"kind": "test"}, "dtype": "bfloat16", "device": "cpu", "attn_implementation": "sdpa",
            "backend": "transformers"}
NUMBERS = ("01", "02", "03", "04", "05", "06", "07", "08")


def test_the_course_profile_is_the_notebooks_as_shipped():
    for nb in NUMBERS:
        defaults = profiles.shipped_defaults(nb)
        assert defaults["PROFILE"] == "course"
        namespace = dict(defaults)
        assert profiles.use("course", nb, namespace) == {} and namespace == defaults


@pytest.mark.parametrize("name", ["paper", "paper-gpu"])
def test_every_value_a_profile_sets_is_one_the_notebook_declares(name):
    prof = profiles.profile(name)
    for nb in prof.settings:
        assert set(profiles.settings(name, nb)) <= set(profiles.shipped_defaults(nb))
    for run in prof.runs:
        assert set(run.parameters) <= set(profiles.shipped_defaults(run.notebook)), run.label
        for values in run.by_model.values():
            assert set(values) <= set(profiles.shipped_defaults(run.notebook)), run.label


def test_the_paper_profile_has_the_papers_shape():
    s = profiles.profile("paper").settings
    assert (s["02"]["NUM_DOCS"], s["02"]["POSITIONS"]) == (20, (0, 4, 9, 14, 19))
    assert (s["01"]["NUM_PAIRS"], s["01"]["POSITIONS"]) == (75, (0, 24, 49, 74))
    runs = {r.label: r for r in profiles.profile("paper").runs}
    assert runs["02-qa-30"].parameters["POSITIONS"] == (0, 4, 9, 14, 19, 24, 29)
    assert runs["01-kv-140"].parameters["POSITIONS"] == (0, 34, 69, 104, 139)
    assert s["01"]["LEAST"] >= 100 and s["02"]["LEAST"] >= 100
    assert runs["01-kv-140"].parameters["MOST"] == 100  # the floor, declared before the run (docs/paper.md)


def test_gemma_at_75_pairs_is_capped_at_the_floor_and_smollm2s_finished_run_stays_done():
    prof = profiles.profile("paper")
    smollm2, gemma = paper.jobs(prof, only=["01-kv-75"], root=ROOT)[0]
    assert gemma.model == "gemma3-270m" and gemma.parameters["MOST"] == 100  # declared before it ran (docs/paper.md)
    assert "MOST" not in smollm2.parameters and smollm2.settings["MOST"] == 400
    # the committed ledger's finished SmolLM2 run has this digest: a cap for Gemma alone must not rerun it
    assert json.loads((ROOT / "reports/paper/runs.json").read_text())[smollm2.key]["digest"] == smollm2.digest
    s = prof.settings["01"]
    per_q = profiles.SECONDS_PER_QUESTION[(gemma.model, "01-kv-75")]
    assert prof.seconds[gemma.key] == pytest.approx((per_q * (s["PILOT"] + 100),) * 2)  # the ETA knows the cap


def test_a_profile_keeps_the_values_you_set(capsys):
    namespace = dict(profiles.shipped_defaults("02"), NUM_DOCS=30, POSITIONS=(0, 14, 29))
    changed = profiles.use("paper", "02", namespace)
    assert namespace["NUM_DOCS"] == 30 and namespace["POSITIONS"] == (0, 14, 29)
    assert namespace["SENTENCES"] == profiles.PAPER_SENTENCES and changed["LEAST"] == 100
    assert "NUM_DOCS" not in changed and "kept as you set them: NUM_DOCS=30" in capsys.readouterr().out


def test_an_unknown_profile_is_one_clear_error():
    with pytest.raises(ConfigError, match="unknown profile 'papers'.*course, paper, paper-gpu"):
        profiles.use("papers", "02", {})


def test_paper_documents_are_about_as_long_as_the_papers():
    from litm.data import generate_fictional_qa

    words = [len(d.text.split()) for e in generate_fictional_qa(5, 20, 0, profiles.PAPER_SENTENCES)
             for d in e.documents]
    assert 85 <= np.mean(words) <= 115  # the paper's passages: 100 words


def test_the_runs_of_a_profile(tmp_path):
    prof = profiles.profile("paper")
    todo, skipped = paper.jobs(prof, root=ROOT)
    keys = [j.key for j in todo]
    assert "smollm2-135m/01-kv-140" not in keys and "gemma3-270m/01-kv-140" in keys  # an 8k window cannot hold 140 pairs
    assert any("01-kv-140 on smollm2-135m" in s for s in skipped)
    # the table's sweeps first, each on both models, then each model's other runs in the notebooks' order
    assert keys[:7] == [f"{m}/{label}" for label in ("02-qa-20", "02-qa-30", "01-kv-75") for m in prof.models] + [
        "gemma3-270m/01-kv-140"]
    assert keys[7:] == [f"{m}/{r.label}" for m in prof.models for r in prof.runs if r.notebook > "02"
                        and (r.per_model or m == prof.models[0])]
    assert [k for k in keys if k.endswith("07-diagnosis")] == ["smollm2-135m/07-diagnosis"]  # it compares the two itself
    job = next(j for j in todo if j.key == "gemma3-270m/02-qa-30")
    assert job.parameters["MODEL"] == "gemma3-270m" and job.parameters["NUM_DOCS"] == 30
    assert job.parameters["FIGURES_DIR"] == "../figures/paper/gemma3-270m/02-qa-30"
    assert job.executed == ROOT / "notebooks" / "paper" / "gemma3-270m" / "02-qa-30.ipynb"
    assert "REPORT_DIR" in next(j for j in todo if j.run.notebook == "06").parameters
    # a job array: every n-th model; a parameter goes only where it is declared
    first, _ = paper.jobs(prof, shard=(0, 2), root=ROOT, overrides={"LIMIT": 3})
    second, _ = paper.jobs(prof, shard=(1, 2), root=ROOT)
    assert {j.model for j in first} == {"smollm2-135m"} and {j.model for j in second} == {"gemma3-270m"}
    assert len(first) + len(second) == len(todo)
    assert all(("LIMIT" in j.parameters) == ("LIMIT" in declared(j.source)) for j in first)
    only, _ = paper.jobs(prof, only=["02"], root=ROOT)
    assert {j.run.label for j in only} == {"02-qa-20", "02-qa-30"}
    # NN.NAME sets one notebook's parameter; a name no run declares is an error, not a silent no-op
    scoped, _ = paper.jobs(prof, models=["smollm2-135m"], root=ROOT, overrides={"06.DEPTHS": 4})
    assert [j.run.notebook for j in scoped if j.parameters.get("DEPTHS") == 4] == ["06"]
    with pytest.raises(ConfigError, match="no run declares 03.MOST, LIMT"):
        paper.jobs(prof, root=ROOT, overrides={"LIMT": 3, "03.MOST": 3})


def test_the_gpu_profile_says_to_fetch_the_data_first():
    with pytest.raises(ConfigError, match="python -m litm fetch liu2023"):
        paper.jobs(profiles.profile("paper-gpu"), root=ROOT)


def test_a_model_path_becomes_a_folder_name():
    assert paper.slug("Qwen/Qwen2.5-7B-Instruct") == "Qwen--Qwen2.5-7B-Instruct"
    assert paper.slug("/tmp/x/tiny-llama") == "tiny-llama" and paper.slug("gemma3-270m") == "gemma3-270m"


def test_the_paper_profile_pins_bfloat16_and_a_cpu_that_emulates_it_slowly_stops_before_anything_runs(
        monkeypatch, capsys):
    import torch

    import litm.models

    prof = profiles.profile("paper")
    assert {prof.settings[nb].get("DTYPE") for nb in NUMBERS} == {"bfloat16"}  # every notebook, whatever the CPU
    todo, _ = paper.jobs(prof, only=["02-qa-20"], models=["smollm2-135m"], root=ROOT)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(litm.models, "cpu_bfloat16_units", lambda: None)
    monkeypatch.setattr(litm.models, "bfloat16_speedup", lambda: 0.02)  # the AVX2 EPYC's emulation
    with pytest.raises(ConfigError, match=r"no bfloat16 units.*0\.02x float32's speed.*-p DTYPE float32"):
        paper.check_dtype(prof, todo)
    own, _ = paper.jobs(prof, only=["02-qa-20"], models=["smollm2-135m"], root=ROOT, overrides={"DTYPE": "float32"})
    paper.check_dtype(prof, own)  # float32 asked for: runs
    monkeypatch.setattr(litm.models, "bfloat16_speedup", lambda: 0.28)  # the AVX-512 Xeon's emulation: runs, noted
    paper.check_dtype(prof, todo)
    assert "0.28x float32's speed" in capsys.readouterr().err
    monkeypatch.setattr(litm.models, "bfloat16_speedup", lambda: pytest.fail("units need no timing"))
    monkeypatch.setattr(litm.models, "cpu_bfloat16_units", lambda: "AVX512-BF16")
    paper.check_dtype(prof, todo)  # a CPU with bfloat16 units: runs


def test_the_ledger_skips_what_is_done_and_jobs_share_it(tmp_path):
    prof = profiles.profile("paper")
    todo, _ = paper.jobs(prof, root=ROOT)
    a, b = (replace(j, executed=tmp_path / f"{j.run.label}.ipynb") for j in todo[:2])
    first, second = paper.Ledger(tmp_path / "runs.json"), paper.Ledger(tmp_path / "runs.json")
    first.record(a, 12.0)
    second.record(b, 30.0)  # another job of the array, which read the ledger before the first wrote
    assert set(json.loads((tmp_path / "runs.json").read_text())) == {a.key, b.key}
    assert not paper.Ledger(tmp_path / "runs.json").done(a)  # no executed copy: not done
    a.executed.write_text("{}")
    assert paper.Ledger(tmp_path / "runs.json").done(a)
    changed = replace(a, parameters={**a.parameters, "MOST": 5})
    assert not paper.Ledger(tmp_path / "runs.json").done(changed)  # other parameters: run again
    assert a.settings["MOST"] == profiles.profile("paper").settings[a.run.notebook]["MOST"]
    edited = replace(a, settings={**a.settings, "MOST": a.settings["MOST"] + 100})
    assert not paper.Ledger(tmp_path / "runs.json").done(edited)  # the profile's own values changed: run again too


def test_a_stopped_run_keeps_its_seconds_and_the_rerun_adds_them(monkeypatch, tmp_path):
    import litm.notebooks

    prof = profiles.profile("paper")
    todo, _ = paper.jobs(prof, only=["02-qa-20"], models=["smollm2-135m"], root=ROOT, out=tmp_path)
    job = todo[0]
    now = [0.0]
    monkeypatch.setattr(paper.time, "perf_counter", lambda: now[0])
    stored = [1000]  # records already in the results folders (other runs'), then this run's
    monkeypatch.setattr(paper, "Records", lambda roots, model: lambda: stored[0])

    def stopped(source, out, *args, name, **kwargs):
        now[0] += 700.0
        stored[0] += 40
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / name).write_text('{"half": "written"}')
        raise KeyboardInterrupt

    def finishes(source, out, *args, name, **kwargs):
        now[0] += 500.0
        (Path(out) / name).write_text("{}")

    ledger = paper.Ledger(tmp_path / "runs.json")
    monkeypatch.setattr(paper, "hardware", lambda: "Xeon, 2 cores")
    monkeypatch.setattr(litm.notebooks, "execute", stopped)
    with pytest.raises(KeyboardInterrupt):
        paper.run_jobs(prof, [job], ledger, progress=False)
    entry = json.loads((tmp_path / "runs.json").read_text())[job.key]
    assert entry["partial_seconds"] == 700.0 and entry["attempts"] == 1 and "seconds" not in entry
    assert entry["partial_records"] == 40 and paper.Ledger(tmp_path / "runs.json").stored(job) == 40
    assert not paper.Ledger(tmp_path / "runs.json").done(job)
    # the half-written copy is kept aside under a name git ignores, never under the run's own
    assert not job.executed.exists() and job.executed.with_suffix(".stopped.ipynb").read_text() == '{"half": "written"}'
    monkeypatch.setattr(litm.notebooks, "execute", finishes)
    monkeypatch.setattr(paper, "hardware", lambda: "EPYC, 2 cores")  # resumed on another machine
    paper.run_jobs(prof, [job], paper.Ledger(tmp_path / "runs.json"), progress=False)
    entry = json.loads((tmp_path / "runs.json").read_text())[job.key]
    assert entry["seconds"] == 1200.0 and entry["attempts"] == 2 and "partial_seconds" not in entry
    assert entry["hardware"] == "Xeon, 2 cores; EPYC, 2 cores"
    assert paper.Ledger(tmp_path / "runs.json").done(job) and paper.Ledger(tmp_path / "runs.json").stored(job) == 0
    changed = replace(job, parameters={**job.parameters, "MOST": 5})  # other parameters start the count again
    paper.Ledger(tmp_path / "runs.json").record(changed, 30.0, finished=False)
    assert json.loads((tmp_path / "runs.json").read_text())[job.key]["partial_seconds"] == 30.0


def test_a_running_run_saves_its_seconds_so_a_killed_one_keeps_them(monkeypatch, tmp_path):
    import os
    import threading

    import litm.notebooks

    prof = profiles.profile("paper")
    job = paper.jobs(prof, only=["02-qa-20"], models=["smollm2-135m"], root=ROOT, out=tmp_path)[0][0]
    now = [0.0]
    monkeypatch.setattr(paper.time, "perf_counter", lambda: now[0])
    seen = []

    def saved(seconds):  # the ledger's entry once a save has caught up with `seconds` (5 s at most)
        for _ in range(500):
            f = tmp_path / "runs.json"
            entry = json.loads(f.read_text())[job.key] if f.is_file() else {}
            if entry.get("partial_seconds") == seconds:
                return entry
            threading.Event().wait(0.01)
        raise AssertionError(f"no save of {seconds} s: {entry}")

    def runs(source, out, *args, name, **kwargs):
        os.chdir(source.parent)  # as papermill does while a notebook runs: the ledger's saves must not follow
        for seconds in (600.0, 1200.0):  # saves land while the run goes on
            now[0] = seconds
            seen.append(saved(seconds))
        now[0] = 1500.0
        os.chdir(tmp_path)
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / name).write_text("{}")

    monkeypatch.setattr(litm.notebooks, "execute", runs)
    monkeypatch.chdir(tmp_path)
    paper.run_jobs(prof, [job], paper.Ledger(Path("runs.json")), progress=False, save_every=0.01)
    # what a SIGKILL after each save would have left: the seconds so far, one attempt, the time last seen running
    assert [(e["partial_seconds"], e["attempts"], "running" in e, "seconds" in e) for e in seen] == [
        (600.0, 1, True, False), (1200.0, 1, True, False)]
    entry = json.loads((tmp_path / "runs.json").read_text())[job.key]
    assert entry["seconds"] == 1500.0 and entry["attempts"] == 1 and "running" not in entry  # nothing counted twice


def test_a_run_is_in_the_ledger_as_under_way_from_its_first_second(monkeypatch, tmp_path):
    import litm.notebooks

    prof = profiles.profile("paper")
    job = paper.jobs(prof, only=["02-qa-30"], models=["smollm2-135m"], root=ROOT, out=tmp_path)[0][0]
    results = tmp_path / "results"
    _write_sweep(results, "smollm2-135m", 30, (0,), 4, 1)  # the pilot's first records, as the run writes them
    seen = []

    def runs(source, out, *args, name, **kwargs):  # long before the first timed save (an hour)
        seen.append(json.loads((tmp_path / "runs.json").read_text())[job.key])
        ledger = paper.Ledger(tmp_path / "runs.json")
        with pytest.raises(paper.NothingToTable, match="under way: smollm2-135m at 30 documents"):
            paper.table(results, prof, ledger, models=["smollm2-135m"])
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / name).write_text("{}")

    monkeypatch.setattr(litm.notebooks, "execute", runs)
    paper.run_jobs(prof, [job], paper.Ledger(tmp_path / "runs.json"), progress=False, save_every=3600.0)
    assert seen[0]["attempts"] == 1 and "running" in seen[0] and "seconds" not in seen[0]


def test_a_batch_systems_sigterm_stops_the_run_like_ctrl_c(monkeypatch, tmp_path):
    import os
    import signal

    import litm.notebooks

    prof = profiles.profile("paper")
    job = paper.jobs(prof, only=["02-qa-20"], models=["smollm2-135m"], root=ROOT, out=tmp_path)[0][0]
    monkeypatch.setattr(litm.notebooks, "execute", lambda *a, **k: os.kill(os.getpid(), signal.SIGTERM))
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stop:
        paper.run_jobs(prof, [job], paper.Ledger(tmp_path / "runs.json"), progress=False)
    assert stop.value.code == 128 + signal.SIGTERM
    assert json.loads((tmp_path / "runs.json").read_text())[job.key]["attempts"] == 1
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back


def test_the_eta_learns_the_machines_speed(monkeypatch):
    todo, _ = paper.jobs(profiles.profile("paper"), root=ROOT)
    a, b, c = todo[:3]
    bar = paper.Progress([a, b, c], {a.key: 100.0, b.key: 300.0})  # c unknown: the mean of the known, 200 s
    now = [1000.0]
    monkeypatch.setattr(paper.time, "perf_counter", lambda: now[0])
    bar.started = bar.job_start = now[0]
    bar.current = a
    now[0] += 40
    assert "ETA 1 min 00 s; whole run 0 min 40 s in, ETA 9 min 20 s" in bar.line()  # 60 + 300 + 200 s
    bar.finish(a, 200.0)  # twice as long as expected: the rest is expected to take twice as long too
    bar.current, bar.job_start = b, now[0]
    now[0] += 100
    assert "ETA 8 min 20 s; whole run 2 min 20 s in, ETA 15 min 00 s" in bar.line()  # 600 - 100, then + 400


@pytest.mark.parametrize("units, factor", [("AMX + AVX512-BF16", 1.0), ("AVX512-BF16", 3.0), (None, 6.9),
                                           ("Arm BF16", 1.0)])
def test_the_eta_starts_from_the_profiles_seconds_times_this_cpus_measured_slowdown(monkeypatch, tmp_path, units,
                                                                                    factor):
    import torch

    import litm.models

    class Expected(Exception):
        pass

    def bar(self, todo, expected, stream, earlier, per_record, stored):  # what the progress line expects, caught
        raise Expected(expected, per_record)                               # before anything runs

    prof = profiles.profile("paper")
    job = paper.jobs(prof, only=["02-qa-20"], models=["smollm2-135m"], root=ROOT, out=tmp_path)[0][0]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(litm.models, "cpu_bfloat16_units", lambda: units)
    monkeypatch.setattr(paper.Progress, "__init__", bar)
    with pytest.raises(Expected) as got:
        paper.run_jobs(prof, [job], paper.Ledger(tmp_path / "runs.json"))
    low, high = prof.seconds[job.key]
    assert got.value.args[0][job.key] == pytest.approx((factor * low, factor * high))
    assert got.value.args[1][job.key] == pytest.approx(factor * prof.per_record[job.key])


def test_the_eta_is_a_range_from_the_fewest_questions_to_the_cap(monkeypatch):
    prof = profiles.profile("paper")
    todo, _ = paper.jobs(prof, only=["02-qa-20"], root=ROOT)
    a, b = todo
    s = prof.settings["02"]  # the run's size lies between its fewest questions and its cap, each with the pilot
    per_q = profiles.SECONDS_PER_QUESTION[(a.model, "02-qa-20")]
    assert prof.seconds[a.key] == pytest.approx((per_q * (s["PILOT"] + s["LEAST"]), per_q * (s["PILOT"] + s["MOST"])))
    bar = paper.Progress([a, b], {a.key: (600.0, 1800.0), b.key: (60.0, 120.0)})
    now = [0.0]
    monkeypatch.setattr(paper.time, "perf_counter", lambda: now[0])
    bar.started = bar.job_start = 0.0
    bar.current = a
    now[0] = 300.0
    assert "ETA 5 min 00 s to 25 min 00 s; whole run 5 min 00 s in, ETA 6 min 00 s to 27 min 00 s" in bar.line()
    now[0] = 900.0  # past the fewest questions' guess: only the cap's bound is left
    assert "ETA up to 15 min 00 s; whole run 15 min 00 s in, ETA 1 min 00 s to 17 min 00 s" in bar.line()
    bar.finish(a, 1200.0)  # inside its range: the pilot asked for more questions, the machine is as fast as guessed
    assert bar.ratio() == 1.0
    bar.finish(b, 240.0)  # twice its cap's guess: the machine is slower
    assert bar.ratio() == pytest.approx((1200 + 240) / (1200 + 120))


def test_the_eta_takes_the_running_runs_pace_from_the_records_it_stores(monkeypatch):
    prof = profiles.profile("paper")
    # a question stores a record per gold position and baseline: 7 + closed-book + oracle at 30 documents, 4 +
    # oracle at 75 pairs (the folders the paper run commits)
    assert prof.per_record["smollm2-135m/02-qa-30"] == pytest.approx(26.5 / 9)
    assert prof.per_record["gemma3-270m/01-kv-75"] == pytest.approx(76.1 / 5)
    a, b = paper.jobs(prof, only=["02-qa-20"], root=ROOT)[0]
    stored = [0]
    bar = paper.Progress([a, b], {a.key: (600.0, 1800.0), b.key: (60.0, 120.0)}, records=lambda: stored[0],
                         per_record={a.key: 2.0})
    now = [0.0]
    monkeypatch.setattr(paper.time, "perf_counter", lambda: now[0])
    bar.started = bar.job_start = 0.0
    bar.current = a
    now[0], stored[0] = 100.0, paper.Progress.LIVE_AFTER - 1  # too few records yet: the guess as it stands
    assert "ETA 8 min 20 s to 28 min 20 s; whole run 1 min 40 s in, ETA 9 min 20 s to 30 min 20 s" in bar.line()
    stored[0] = 25  # 4 s a record against 2 expected: twice as slow, this run (1200-3600 s) and the next (120-240)
    assert "ETA 18 min 20 s to 58 min 20 s; whole run 1 min 40 s in, ETA 20 min 20 s to 1 h 02 min" in bar.line()


def test_once_the_pilot_has_planned_the_runs_eta_is_one_time(monkeypatch, tmp_path):
    a, b = paper.jobs(profiles.profile("paper"), only=["02-qa-20"], root=ROOT)[0]
    bar = paper.Progress([a, b], {a.key: (600.0, 1800.0), b.key: (60.0, 120.0)}, per_record={a.key: 2.0})
    bar.plans = {a.key: tmp_path / "a.json", b.key: tmp_path / "b.json"}
    now = [0.0]
    monkeypatch.setattr(paper.time, "perf_counter", lambda: now[0])
    bar.started = bar.job_start = 0.0
    bar.current = a
    now[0] = 100.0
    assert "ETA 8 min 20 s to 28 min 20 s;" in bar.line()  # no plan yet: the range
    (tmp_path / "a.json").write_text('{"records": 450, "seconds": 2000.0}')  # 450 records at 2 s: 900 s
    assert "ETA 13 min 20 s; whole run 1 min 40 s in, ETA 14 min 20 s to 15 min 20 s" in bar.line()
    (tmp_path / "a.json").write_text('{"records": 900}')  # read once: a later write changes nothing
    assert "ETA 13 min 20 s;" in bar.line()
    bar.finish(a, 1800.0)  # twice the plan's 900 s: the machine is twice as slow
    bar.current, bar.job_start = b, now[0]
    (tmp_path / "b.json").write_text('{"records": 30, "seconds": 300.0}')  # no seconds a record known: the plan's
    now[0] += 100.0
    assert "ETA 3 min 20 s; whole run" in bar.line()  # 300 s of this machine's, 100 of them gone


def test_a_resumed_runs_eta_is_the_records_left_at_todays_pace(monkeypatch, tmp_path):
    a, b = paper.jobs(profiles.profile("paper"), only=["02-qa-20"], root=ROOT, out=tmp_path)[0]
    ledger = paper.Ledger(tmp_path / "runs.json")
    ledger.record(a, 3000.0, finished=False, records=300)  # earlier attempts: 300 records at 10 s
    ledger.record(a, 1000.0, finished=False, new_attempt=False, records=100)
    assert ledger.stored(a) == 400 and ledger.stored(b) == 0
    ledger.entries[b.key] = {**ledger.entries[a.key], "digest": b.digest}
    del ledger.entries[b.key]["partial_records"]  # saved before the ledger counted records
    assert ledger.stored(b) is None
    stored = [5000]
    bar = paper.Progress([a], {a.key: (600.0, 1800.0)}, records=lambda: stored[0], per_record={a.key: 2.0},
                         earlier={a.key: ledger.spent(a)}, stored={a.key: ledger.stored(a)})
    bar.plans = {a.key: tmp_path / "a.json"}
    (tmp_path / "a.json").write_text('{"records": 1000, "seconds": 9000.0}')
    now = [0.0]
    monkeypatch.setattr(paper.time, "perf_counter", lambda: now[0])
    bar.start(a)
    now[0] = 50.0
    stored[0] += 5  # too few for a pace: 595 left at the expected 2 s a record
    assert "ETA 19 min 50 s;" in bar.line()
    now[0], stored[0] = 300.0, stored[0] + 10  # today 20 s a record, twice the earlier attempts' 10 s
    # 585 records left at 20 s, not (1000 records at 20 s) less the 4000 s the earlier attempts took at 10 s
    assert "ETA 3 h 15 min; whole run" in bar.line()
    bar.close()


def test_a_resumed_runs_eta_counts_its_earlier_attempts_seconds(monkeypatch, tmp_path):
    prof = profiles.profile("paper")
    a, b = paper.jobs(prof, only=["02-qa-20"], root=ROOT, out=tmp_path)[0]
    ledger = paper.Ledger(tmp_path / "runs.json")
    ledger.record(a, 250.0, finished=False)
    ledger.record(a, 150.0, finished=False, new_attempt=False)  # two saves of one stopped attempt: 400 s
    assert (ledger.spent(a), ledger.spent(b)) == (400.0, 0.0)
    changed = dataclasses.replace(a, parameters={**a.parameters, "SEED": -1})  # other parameters: that run starts afresh
    assert paper.Ledger(tmp_path / "runs.json").spent(changed) == 0.0
    bar = paper.Progress([a, b], {a.key: (600.0, 1800.0), b.key: (60.0, 120.0)},
                         earlier={j.key: ledger.spent(j) for j in (a, b)})
    now = [0.0]
    monkeypatch.setattr(paper.time, "perf_counter", lambda: now[0])
    bar.started = bar.job_start = 0.0
    bar.current = a
    now[0] = 100.0  # 600 - 400 - 100 and 1800 - 400 - 100 left of it; then b's 60-120
    assert ("0 min 00 s in" not in bar.line() and "1 min 40 s in (+ 6 min 40 s in earlier attempts), "
            "ETA 1 min 40 s to 21 min 40 s; whole run 1 min 40 s in, ETA 2 min 40 s to 23 min 40 s") in bar.line()
    ledger.record(a, 10.0)  # finished: nothing of it is left to resume
    assert ledger.spent(a) == 0.0


def test_progress_counts_the_records_a_run_stores(monkeypatch, tmp_path):
    import io

    first = tmp_path / "results" / "a1" / "records.jsonl"
    first.parent.mkdir(parents=True)
    first.write_text('{"n": 1}\n' * 5)
    stored = paper.Records([tmp_path / "results", first.parent, tmp_path / "not-made-yet"])
    assert stored() == 5  # a folder under two roots counts once
    todo, _ = paper.jobs(profiles.profile("paper"), root=ROOT)
    now = [0.0]
    monkeypatch.setattr(paper.time, "perf_counter", lambda: now[0])
    bar = paper.Progress(todo[:1], {}, stream=io.StringIO(), records=stored)
    bar.start(todo[0])
    assert "records stored" not in bar.line()  # none yet in this run
    now[0] = 120.0
    with open(first, "a") as fh:
        fh.write('{"n": 2}\n' * 4)
    (tmp_path / "results" / "b2").mkdir()
    (tmp_path / "results" / "b2" / "records.jsonl").write_text('{"n": 3}\n' * 2)
    assert bar.line().endswith("; 6 records stored in this run, 20 s each")
    bar.close()


def test_a_runs_records_are_its_models_so_an_arrays_jobs_do_not_count_each_others(tmp_path):
    def folder(name, model, n):
        (tmp_path / name).mkdir()
        if model:
            (tmp_path / name / "manifest.json").write_text(json.dumps({"config": {"model": model}}))
        (tmp_path / name / "records.jsonl").write_text('{"n": 1}\n' * n)

    folder("a", "gemma3-270m", 3)
    folder("b", "smollm2-135m", 5)  # another job of the array, writing beside it
    folder("c", None, 7)  # its manifest not written yet
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "manifest.json").write_text("[1, 2]")  # not a litm manifest
    (tmp_path / "d" / "records.jsonl").write_text('{"n": 1}\n' * 11)
    gemma = paper.Records([tmp_path], "gemma3-270m")
    assert (gemma(), paper.Records([tmp_path], "smollm2-135m")(), paper.Records([tmp_path])()) == (3, 5, 26)
    (tmp_path / "c" / "manifest.json").write_text(json.dumps({"config": {"model": "gemma3-270m"}}))
    with open(tmp_path / "a" / "records.jsonl", "a") as fh:
        fh.write('{"n": 2}\n')
    assert gemma() == 3 + 1 + 7


def test_progress_redraws_a_terminal_line_and_appends_to_a_log_file():
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    todo, _ = paper.jobs(profiles.profile("paper"), root=ROOT)
    log, term = io.StringIO(), Terminal()
    for stream, every in ((log, 60.0), (term, 5.0)):
        bar = paper.Progress(todo[:1], {}, stream=stream)
        assert bar.every == every
        bar.finish(todo[0], 61.0)
    assert log.getvalue() == f"{todo[0].key}: done in 1 min 01 s\n"
    assert term.getvalue().startswith("\r") and term.getvalue().rstrip().endswith("done in 1 min 01 s")


def _write_sweep(root, model, num_docs, positions, n, seed, task="qa", latency=2.0):
    """A sweep with closed-book and oracle written directly: margins drawn per position, right when above 0,
    each scored in `latency` seconds."""
    rng = np.random.default_rng(seed)
    base = SweepConfig(task=task, model=model, num_docs=num_docs, positions=positions, limit=n)
    truth = {}
    for cond, pos in base.conditions():
        mean = -1.0 if cond == "closedbook" else 2.0 if cond == "oracle" else (1.0 if pos in (0, num_docs - 1) else
                                                                                  -0.5)
        margins = rng.normal(mean, 1.5, n)
        rc = Sweep(base).run_config({**IDENTITY, "weights": {"kind": "test", "model": model}},
                                    {"condition": cond, "position": pos})
        store = ResultStore(root, config_hash(rc), rc)
        for i, mg in enumerate(margins):
            store.append({"example_id": f"q{i}", "condition": cond, "position": pos, "status": "ok",
                          "correct": bool(mg > 0), "gold_loglik": -1.0, "gold_margin": float(mg), "gold_rank": 1,
                          "prompt_tokens": 500, "scoring": "choice", "latency_s": latency})
        store.close()
        truth[(cond, pos)] = margins
    return truth


def test_the_table_reads_the_studys_sweep_and_its_numbers_match_the_records(tmp_path):
    results = tmp_path / "results"
    positions = (0, 4, 9, 14, 19)
    truth = _write_sweep(results, "smollm2-135m", 20, positions, 40, 0)
    _write_sweep(results, "smollm2-135m", 20, positions, 8, 1)  # a pilot-sized sweep of the same shape: not used
    ledger = paper.Ledger(tmp_path / "runs.json")
    ledger.entries = {"smollm2-135m/02-qa-20": {"seconds": 754.0, "hardware": "a test CPU, 2 cores; another CPU"},
                      "smollm2-135m/01-kv-75": {"partial_seconds": 9.0, "hardware": "a third CPU"}}
    text, used, long = paper.table(results, profiles.profile("paper"), ledger, models=["smollm2-135m"])
    assert len(used) == 1 and used[0].n_questions == 40
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| smollm2-135m"))
    accuracy, margin = (r.split(" | ") for r in lines[first:first + 2])
    assert margin[0].strip() == "|" and margin[1] == "gold margin (nats)"  # the model named once, on its first row
    # accuracy at gold 1: the share of positive margins, with its Wilson interval
    k = int((truth[("documents", 0)] > 0).sum())
    lo, hi = sps.binomtest(k, 40).proportion_ci(method="wilson")
    assert accuracy[2] == f"{100 * k / 40:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}]"
    # the margin's middle penalty: each question's edges minus its middle, a t interval over the 40
    per_q = (truth[("documents", 0)] + truth[("documents", 19)]) / 2 - truth[("documents", 9)]
    half = sps.t.ppf(0.975, 39) * per_q.std(ddof=1) / np.sqrt(40)
    assert margin[-3].startswith(f"{per_q.mean():+.2f} [{per_q.mean() - half:+.2f}, {per_q.mean() + half:+.2f}] nats")
    assert f"p = {sps.ttest_1samp(per_q, 0).pvalue:.2g}" in margin[-3]
    assert margin[-3].endswith("; excludes 0") and "excludes" not in accuracy[-3]  # margin is the primary measure
    assert accuracy[-2] == "40" and accuracy[-1].strip(" |") == "12 min 34 s"
    assert lines[first + 1].endswith("excludes 0 |  |  |")  # the same n and wall time, not said twice
    assert f"{truth[('oracle', None)].mean():+.2f}" == margin[8]
    assert "GPT-3.5-Turbo (0613), published" in text and "75.8%" in text and "+15.7 points" in text
    # the machines of the rows in the table, each once (a resumed run's too), not those of runs elsewhere
    assert "Hardware: a test CPU, 2 cores; another CPU. " in text
    assert set(long["position"].dropna()) == {1, 5, 10, 15, 20}
    # a ledger short of the records' own scoring seconds (7 conditions x 40 questions x 2 s): an attempt was killed
    # before it could save, and the wall time says what the records prove
    ledger.entries["smollm2-135m/02-qa-20"]["seconds"] = 300.0
    text, _, _ = paper.table(results, profiles.profile("paper"), ledger, models=["smollm2-135m"])
    assert {line.split(" | ")[-1].strip(" |") for line in text.splitlines() if line.startswith("| smollm2")} == {
        "≥ 9 min 20 s"}
    # a run still under way holds part of its sweep: named under the table, never a row of it
    _write_sweep(results, "gemma3-270m", 20, positions, 40, 2)
    ledger.entries["gemma3-270m/02-qa-20"] = {"partial_seconds": 100.0, "hardware": "a third CPU"}
    text, used, _ = paper.table(results, profiles.profile("paper"), ledger)
    assert [r.config["model"] for r in used] == ["smollm2-135m"] and "| gemma3-270m" not in text
    assert "Under way, not in the table until they finish: gemma3-270m at 20 documents." in text
    assert "a third CPU" not in text
    del ledger.entries["smollm2-135m/02-qa-20"]["seconds"]
    with pytest.raises(paper.NothingToTable, match="under way: smollm2-135m at 20 documents; gemma3-270m at 20"):
        paper.table(results, profiles.profile("paper"), ledger)


def test_a_null_penalty_is_read_against_the_smallest_effect_by_two_one_sided_tests():
    from litm import stats

    rng = np.random.default_rng(3)
    for values, smallest, word in ((rng.normal(0.05, 0.4, 60), 0.5, "within"), (rng.normal(0.1, 2.0, 12), 0.5, "cannot")):
        expected = max(sps.ttest_1samp(values, -smallest, alternative="greater").pvalue,
                       sps.ttest_1samp(values, smallest, alternative="less").pvalue)
        est = stats.t_estimate(values)
        assert paper.equivalence_p(est, smallest) == pytest.approx(expected, rel=1e-6)
        reading = paper._reading(est, stats.measure("margin"), smallest)
        assert reading.startswith(word)
        # how large an effect it rules out: the margin at which scipy's own two one-sided tests give p = 0.05
        bound = stats.equivalence_bound(est)
        at_bound = max(sps.ttest_1samp(values, -bound, alternative="greater").pvalue,
                       sps.ttest_1samp(values, bound, alternative="less").pvalue)
        assert at_bound == pytest.approx(0.05, rel=1e-6) and f"beyond +-{bound:.2f}" in reading


def test_the_summary_writes_the_table_report_figures_and_the_readme_block(tmp_path):
    results = tmp_path / "results"
    for model, seed in (("smollm2-135m", 0), ("gemma3-270m", 2)):
        _write_sweep(results, model, 20, (0, 4, 9, 14, 19), 12, seed)
        _write_sweep(results, model, 75, (0, 24, 49, 74), 12, seed + 1, task="kv")
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- paper-table -->\nSTALE\n<!-- paper-table -->\nafter\n")
    paper.summarize(profiles.profile("paper"), results, tmp_path / "reports", tmp_path / "figures", readme=readme)
    for name in ("table.md", "report.md", "report.tex", "report.csv"):
        assert (tmp_path / "reports" / name).stat().st_size > 100
    for task in ("qa", "kv"):
        assert (tmp_path / "figures" / f"{task}-position-curves.png").stat().st_size > 10_000
    body = readme.read_text()
    assert "STALE" not in body and body.endswith("<!-- paper-table -->\nafter\n")
    assert body.count("| gemma3-270m (bfloat16) | accuracy |") == 2  # QA at 20 and KV at 75
    # a run of one model (`--models smollm2-135m`) rebuilds the table with the other's finished rows still in it
    text = paper.summarize(profiles.profile("paper"), results, tmp_path / "reports", tmp_path / "figures",
                           models=["smollm2-135m"])
    assert text.count("| gemma3-270m (bfloat16) | accuracy |") == 2


def test_the_overlay_draws_each_models_study_sweep_not_its_pilot(tmp_path, monkeypatch):
    from litm import plots
    from litm.report import load_results

    results = tmp_path / "results"
    for model, seed in (("smollm2-135m", 0), ("gemma3-270m", 2)):
        _write_sweep(results, model, 20, (0, 4, 9, 14, 19), 12, seed)
        _write_sweep(results, model, 20, (0, 4, 9, 14, 19), 4, seed + 10)  # a pilot of the same shape
    df = load_results(results)
    prof = profiles.profile("paper")
    _, used, _ = paper.table(df, prof, paper.Ledger(tmp_path / "runs.json"))
    saved = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, name, out: saved.append(fig) or [name])
    assert paper.overlay_figures(df, used, prof, tmp_path) == ["qa-position-curves"]
    accuracy = saved[0].axes[0]
    curves = {line.get_label(): line.get_ydata() for line in accuracy.get_lines()
              if line.get_label() in ("smollm2-135m", "gemma3-270m")}
    assert set(curves) == {"smollm2-135m", "gemma3-270m"}
    study = df[df["sweep_id"].isin([r.sweep_id for r in used]) & (df["model"] == "gemma3-270m")
               & (df["condition"] == "documents")]
    expected = study.groupby("position")["correct"].mean().to_numpy()
    assert np.allclose(curves["gemma3-270m"], expected)  # the 12-question study, not the 4-question pilot


def test_the_cli_lists_the_runs_without_running_them(capsys):
    assert main(["paper", "--list", "--only", "02"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"smollm2-135m/02-qa-20: (to do|done)", out) and "gemma3-270m/02-qa-30" in out
    assert main(["paper", "--profile", "nope", "--list"]) == 2
    assert main(["paper", "--only", "09", "--list"]) == 2 and "--only 09: no run of the paper profile" in \
        capsys.readouterr().err
    assert main(["paper", "--models", "nosuch-model", "--list"]) == 2 and "unknown model 'nosuch-model'" in \
        capsys.readouterr().err


def test_a_run_that_fills_no_row_of_the_table_ends_with_a_note_not_an_error(monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(paper, "check_dtype", lambda prof, todo: None)
    monkeypatch.setattr(paper, "run_jobs", lambda prof, todo, ledger: ran.extend(todo))

    def nothing(*args):
        raise paper.NothingToTable("no finished sweep of smollm2-135m at the profile's shapes in the results")

    monkeypatch.setattr(paper, "summarize", nothing)
    assert main(["paper", "--only", "03", "--models", "smollm2-135m"]) == 0
    assert [j.key for j in ran] == ["smollm2-135m/03-attention-20"]
    assert "no table yet: no finished sweep" in capsys.readouterr().err
    assert main(["paper", "--summary", "--models", "smollm2-135m"]) == 2  # asked for the table alone: an error


# CI sizes for every run of the paper profile: the paper's shapes (20 and 30 documents of 100 words, 75 and 140
# pairs), a few questions each
TINY_SIZES = {"DTYPE": "float32", "MOST": 3, "LEAST": 3, "PILOT": 3, "LIMIT": 2, "CAL_EXAMPLES": 1,
              "SINK_LENGTHS": (1000, 2000), "SHARED": 2, "TIME_FIRST": 1, "LENGTHS": (1000, 2000), "GRID_LIMIT": 3, "06.DEPTHS": 4, "ORDERS": 1,
              "BIAS_EXAMPLES": 1, "CHANNEL_EXAMPLES": 2, "SORT_ROUNDS": 1,
              "LEVERS": ("baseline", "attention_sort", "calibration", "rescaling", "channel_scaling", "parallel")}


@pytest.mark.notebook
def test_the_paper_profile_runs_end_to_end_at_ci_sizes_and_resumes(tmp_path, capsys):
    """`make paper`'s code path on a tiny random model with a long window: every run, the ledger, the summary."""
    from conftest import build_tiny_model

    model = str(build_tiny_model(tmp_path / "tiny-llama", chat=True, max_positions=32768))
    second = str(build_tiny_model(tmp_path / "tiny-gemma3", chat=True, max_positions=32768, arch="gemma3"))
    prof = profiles.profile("paper")
    overrides = {**TINY_SIZES, "RESULTS_DIR": str(tmp_path / "results"), "SECOND_MODEL": second}
    todo, skipped = paper.jobs(prof, [model], overrides=overrides, root=ROOT, out=tmp_path)
    assert not skipped and {j.run.label for j in todo} == {r.label for r in prof.runs}
    ledger = paper.Ledger(tmp_path / "reports" / "paper" / "runs.json")
    told, finish = {}, paper.Progress.finish

    def finished(bar, job, seconds):  # whether the notebook's kernel told the runner its plan
        finish(bar, job, seconds)
        told[job.run.label] = job.key not in bar.plans and len(set(bar.expected[job.key])) == 1

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(paper.Progress, "finish", finished)
        paper.run_jobs(prof, todo, ledger, progress=False)
    assert told == {r.label: r.notebook not in ("03", "06") for r in prof.runs}  # the notebooks that plan a size
    assert planning.PLAN_FILE not in os.environ
    for j in todo:
        assert j.executed.is_file() and list((tmp_path / "figures" / "paper" / "tiny-llama" / j.run.label).glob("*.png"))
    text = paper.summarize(prof, tmp_path / "results", tmp_path / "reports" / "paper", tmp_path / "figures" / "paper",
                           models=[model])
    for heading in ("Multi-document QA, 20 documents", "Multi-document QA, 30 documents",
                    "Key-value retrieval, 75 key-value pairs", "Key-value retrieval, 140 key-value pairs"):
        assert heading in text
    assert "| gold at 25 | gold at 30 |" in text
    # a rerun makes nothing again: every run is in the ledger with the same parameters
    capsys.readouterr()
    paper.run_jobs(prof, todo, paper.Ledger(tmp_path / "reports" / "paper" / "runs.json"), progress=False)
    assert capsys.readouterr().err.count("done before") == len(todo)


@pytest.mark.notebook
def test_the_gpu_profile_parses_and_starts_on_a_tiny_model_with_the_papers_file_layout(tmp_path):
    """`paper-gpu` on the CPU: the paper's four file shapes (written here in its schema), generation, accuracy."""
    import gzip
    import shutil

    from conftest import build_tiny_model
    from litm.data import fictional_qa_records, kv_records

    for nb in (ROOT / "notebooks").glob("0[12]-*.ipynb"):
        (tmp_path / "notebooks").mkdir(exist_ok=True)
        shutil.copy(nb, tmp_path / "notebooks" / nb.name)
    liu = tmp_path / "data" / "liu2023"
    files = {"qa_data/20_total_documents/nq-open-20_total_documents_gold_at_0.jsonl.gz": fictional_qa_records(6, 20),
             "qa_data/30_total_documents/nq-open-30_total_documents_gold_at_0.jsonl.gz": fictional_qa_records(6, 30),
             "kv_retrieval_data/kv-retrieval-75_keys.jsonl.gz": kv_records(6, 75),
             "kv_retrieval_data/kv-retrieval-140_keys.jsonl.gz": kv_records(6, 140)}
    for name, records in files.items():
        (liu / name).parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(liu / name, "wt") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    model = str(build_tiny_model(tmp_path / "tiny-llama", chat=True, max_positions=32768))
    prof = profiles.profile("paper-gpu")
    overrides = {"MOST": 3, "LEAST": 2, "PILOT": 3, "BATCH_SIZE": 2, "RESULTS_DIR": str(tmp_path / "results")}
    todo, skipped = paper.jobs(prof, [model], overrides=overrides, root=tmp_path)
    assert not skipped and [j.run.label for j in todo] == ["02-qa-20", "02-qa-30", "01-kv-75", "01-kv-140"]
    # one run end to end (a random model generates the whole 100 tokens every time: slow at 75 and 140 pairs)
    run = [j for j in todo if j.run.label == "02-qa-20"]
    paper.run_jobs(prof, run, paper.Ledger(tmp_path / "reports" / "paper-gpu" / "runs.json"), progress=False)
    text = paper.summarize(prof, tmp_path / "results", tmp_path / "reports" / "paper-gpu",
                           tmp_path / "figures" / "paper-gpu", models=[model])
    assert "(generate scoring)" in text and "| gold at 20 | closed-book |" in text and "GPT-3.5-Turbo" in text


def test_git_keeps_the_paper_records_and_ledger_but_not_half_runs_or_locks():
    """A run split across machines continues from a clone only if its records and ledger are committed."""
    import subprocess

    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    kept = ["results/paper/0123abcd/records.jsonl", "results/paper/0123abcd/manifest.json", "reports/paper/runs.json",
            "reports/paper/table.md", "notebooks/paper/m/02-qa-20.ipynb"]
    ignored = ["results/course/0123abcd/records.jsonl", "results/paper/0123abcd/.lock", "reports/paper/runs.lock",
               "reports/paper/runs.tmp", "notebooks/paper/m/02-qa-20.running.ipynb",
               "notebooks/paper/m/02-qa-20.stopped.ipynb"]
    out = subprocess.run(["git", "check-ignore", "--no-index", *kept, *ignored], cwd=ROOT, capture_output=True,
                         text=True).stdout.split()
    assert sorted(out) == sorted(ignored)


def test_the_hardware_names_the_cpus_bfloat16_units_or_their_emulation(monkeypatch):
    import torch

    import litm.models

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(litm.models, "cpu_bfloat16_units", lambda: "AMX")
    assert paper.hardware().endswith(" cores, AMX")
    monkeypatch.setattr(litm.models, "cpu_bfloat16_units", lambda: None)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert paper.hardware().endswith(" cores, bfloat16 emulated (AVX512)")
