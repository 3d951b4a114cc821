"""The one loop under every study: one tie rule for forced choice, a single candidate refused, one window
rule, and one run identity (config, weights, dtype, device, attention implementation, backend)."""
import json
import os
import subprocess
import sys

import pytest

from litm import SweepConfig, sweep
from litm import compression_study as CS
from litm import diagnose as dg
from litm import strategies as S
from litm.cli import main
from litm.data import kv_records, write_jsonl
from litm.errors import ConfigError
from litm.models import load_model, run_identity
from litm.runner import choice_result, target
from litm.types import Document, Example

from conftest import ROOT, build_tiny_model

SAMPLE = ROOT / "data" / "samples" / "rag_cases.jsonl"


@pytest.mark.parametrize("scores, gold, rank, correct, chosen", [
    ([-1.0, -2.0, -3.0], 0, 1, True, 0),
    ([-1.0, -1.0, -3.0], 0, 2, False, 1),  # a tie with the gold counts against it
    ([-3.0, -1.0, -1.0], 1, 2, False, 2),
    ([-1.0, -1.0, -1.0], 2, 3, False, 0),
    ([-5.0, -1.0, -1.0], 0, 3, False, 1),
])
def test_the_tie_rule(scores, gold, rank, correct, chosen):
    s = choice_result(scores, gold)
    assert (s.gold_rank, s.correct, s.chosen) == (rank, correct, chosen)


@pytest.fixture(scope="module")
def flat_lm(tmp_path_factory):
    """The tiny model with its output layer zeroed: every token gets log-probability -log(vocab), so a
    candidate's score depends only on its number of tokens and candidates of one length tie exactly."""
    import torch
    from transformers import AutoModelForCausalLM

    d = build_tiny_model(tmp_path_factory.mktemp("flat"))
    model = AutoModelForCausalLM.from_pretrained(d)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    model.save_pretrained(d)
    return load_model(str(d), device="cpu", dtype="float32", reuse=False)


def _lengths(lm, candidates) -> list[int]:
    """Each candidate's tokens after an "Answer:" prompt (the tiny tokenizer has no chat template)."""
    return [len(lm.tokenizer(" " + c, add_special_tokens=False)["input_ids"]) for c in candidates]


def _check(lm, df_row_correct, candidates, gold) -> bool:
    """The record is right exactly when the gold has strictly fewer tokens than every other candidate;
    returns whether the gold tied with the best."""
    n = _lengths(lm, candidates)
    others = min(m for j, m in enumerate(n) if j != gold)
    assert df_row_correct == (n[gold] < others)
    return n[gold] == others


def test_exact_ties_count_against_the_gold_in_every_study(flat_lm, tmp_path):
    from litm.data import generate_fictional_qa
    from litm.experiment import load_examples
    from litm.ordering import gold_at
    from litm.runner import candidates

    cfg = SweepConfig(task="qa", num_docs=5, positions=(0, 2, 4), limit=6, sentences_per_doc=2, closedbook=False,
                      oracle=False, results_dir=str(tmp_path / "sweep"), progress=False)
    df = sweep(cfg, flat_lm).set_index(["example_id", "position"])
    ties = [_check(flat_lm, df.loc[(e.id, p), "correct"], *candidates(gold_at(e, p)))
            for e in load_examples(cfg) for p in cfg.positions]
    assert len(ties) == 18 and any(ties)

    comp = CS.run(CS.CompressionConfig(num_docs=5, positions=(0, 4), budgets=(2000,), strategies=("truncate",),
                                       limit=3, sentences_per_doc=2, results_dir=str(tmp_path / "comp"),
                                       progress=False), flat_lm)
    examples = {e.id: e for e in generate_fictional_qa(3, 5, 0, 2)}
    ties = [_check(flat_lm, r.correct, *candidates(gold_at(examples[r.example_id], r.position)))
            for r in comp.itertuples()]
    assert len(ties) == 12 and any(ties)

    scfg = S.StrategyConfig(pool=6, k=4, strategies=("rank",), oracle_positions=(0,), variants=("after",), limit=4,
                            sentences_per_doc=2, results_dir=str(tmp_path / "strat"), progress=False)
    strat = S.run(scfg, flat_lm)
    answers = {d.id: d.answer for e in S.load_pools(scfg) for d in e.documents}
    for r in strat[strat["gold_in_prompt"]].itertuples():
        cands = list(dict.fromkeys(answers[d] for d in r.doc_ids))
        _check(flat_lm, r.correct, cands, cands.index(answers[r.doc_ids[int(r.gold_index)]]))

    # the diagnosis used to take np.argmax, which gave a tie to the gold (its first candidate)
    dcfg = dg.DiagnoseConfig(cases=str(SAMPLE), scoring="choice", limit=2, orders=1, seeds=(0,),
                             depths=(0.0, 0.5, 0.95), results_dir=str(tmp_path / "diag"), progress=False)
    diag = dg.run(dcfg, flat_lm)
    trials = {t.id: t for t in dg.DiagnoseStudy(dcfg).units()}
    ties = []
    for r in diag.itertuples():
        ex = trials[r.trial_id].example
        ties.append(_check(flat_lm, r.correct, dg.choices(ex)[0], 0))
        assert (r.prediction == ex.answers[0]) == r.correct
    assert any(ties)


def test_a_forced_choice_with_one_candidate_is_refused(tiny_model_dir, tmp_path, capsys):
    with pytest.raises(ConfigError, match="chance is 100%"):
        SweepConfig(task="qa", num_docs=1, scoring="choice")
    assert main(["sweep", "--task", "qa", "--docs", "1", "--model", str(tiny_model_dir)]) == 2
    assert "chance is 100%" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="chance is 100%"):
        S.StrategyConfig(k=1)
    with pytest.raises(ConfigError, match="chance is 100%"):
        CS.CompressionConfig(num_docs=1, positions=(0,))
    same = Example("e", "q?", ("a",), (Document("g", "", "x a", True, answer="a"), Document("d", "", "y", answer="a")),
                   "qa")
    with pytest.raises(ConfigError, match="chance is 100%"):
        target(same, "choice")
    # a KV file whose pairs all hold one value: refused before a model loads or a record is written
    recs = kv_records(2, 3, seed=1)
    for r in recs:
        r["ordered_kv_records"] = [[k, r["value"]] for k, _ in r["ordered_kv_records"]]
    path = write_jsonl(recs, tmp_path / "one-value.jsonl")
    with pytest.raises(ConfigError, match="chance is 100%"):
        sweep(SweepConfig(task="kv", data=str(path), num_docs=3, positions=(0,), limit=2,
                          results_dir=str(tmp_path / "r"), model="no-such-model"))
    assert not (tmp_path / "r").exists()


def _hashes(results) -> set:
    return {p.parent.name for p in results.glob("*/manifest.json")}


def test_dtype_and_weights_are_part_of_the_run_identity(tmp_path):
    d = build_tiny_model(tmp_path / "m", seed=0)
    cfg = SweepConfig(task="kv", num_docs=4, positions=(0, 3), closedbook=False, oracle=False, limit=2,
                      results_dir=str(tmp_path / "r"), progress=False)
    f32 = load_model(str(d), device="cpu", dtype="float32", reuse=False)
    first = set(sweep(cfg, f32)["config_hash"])
    bf16 = load_model(str(d), device="cpu", dtype="bfloat16", reuse=False)
    second = set(sweep(cfg, bf16)["config_hash"])
    assert len(first) == len(second) == 2 and first.isdisjoint(second)
    manifests = [json.loads((tmp_path / "r" / h / "manifest.json").read_text()) for h in sorted(first | second)]
    assert sorted(m["config"]["dtype"] for m in manifests) == ["bfloat16", "bfloat16", "float32", "float32"]
    assert {m["config"]["device"] for m in manifests} == {"cpu"}
    assert {m["config"]["attn_implementation"] for m in manifests} == {"sdpa"}

    build_tiny_model(d, seed=1)  # other weights in the same folder
    other = load_model(str(d), device="cpu", dtype="float32", reuse=False)
    assert run_identity(other)["weights"] != run_identity(f32)["weights"]
    third = set(sweep(cfg, other)["config_hash"])
    assert third.isdisjoint(first | second) and _hashes(tmp_path / "r") == first | second | third
    eager = load_model(str(d), device="cpu", dtype="float32", attn_implementation="eager", reuse=False)
    assert set(sweep(cfg, eager)["config_hash"]).isdisjoint(third)

    # the same files loaded again: the same folders, nothing recomputed
    again = load_model(str(d), device="cpu", dtype="float32", reuse=False)
    assert set(sweep(cfg, again)["config_hash"]) == third
    assert sum(len((p.parent / "records.jsonl").read_text().splitlines())
               for p in (tmp_path / "r").glob("*/manifest.json")) == 4 * 2 * 2  # four identities


def test_a_model_without_a_weights_identity_is_refused(tiny_lm, tmp_path):
    from dataclasses import replace as dc_replace

    anonymous = dc_replace(tiny_lm, identity={})
    with pytest.raises(Exception, match="no weights identity"):
        sweep(SweepConfig(task="kv", num_docs=3, positions=(0,), limit=1, results_dir=str(tmp_path)), anonymous)


def test_a_hub_model_is_known_by_its_resolved_commit(tiny_model_dir, tmp_path):
    commit = "0123456789abcdef0123456789abcdef01234567"
    snap = tmp_path / "hub" / "models--someone--tiny" / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in tiny_model_dir.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())
    (tmp_path / "hub" / "models--someone--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--someone--tiny" / "refs" / "main").write_text(commit)
    code = ("from litm.models import load_model, run_identity; import json; "
            "print(json.dumps(run_identity(load_model('someone/tiny', device='cpu'))))")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(ROOT / "lib")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["weights"] == {"kind": "hub", "id": "someone/tiny",
                                                                          "revision": commit}


def test_results_written_before_the_run_identity_still_report(tmp_path, capsys):
    """A folder as the previous code wrote it: no kind, no identity, no key or condition in the manifest."""
    folder = tmp_path / "old"
    for pos, right in ((0, [1, 1, 0, 1]), (4, [0, 0, 1, 0]), (9, [1, 0, 1, 1])):
        config = {"chat": None, "closedbook": None, "condition": "documents", "data": "generated-qa",
                  "generate_docs": None, "model": "smollm2-135m", "num_docs": 10, "position": pos,
                  "query_aware": False, "scoring": "choice", "seed": 0, "sentences_per_doc": 3, "task": "qa",
                  "template": "ours"}
        run = folder / f"old{pos:013d}"
        run.mkdir(parents=True)
        (run / "manifest.json").write_text(json.dumps({"config_hash": run.name, "config": config, "model": {},
                                                       "environment": {}}))
        (run / "records.jsonl").write_text("".join(json.dumps(
            {"example_id": f"q{i}", "condition": "documents", "position": pos, "status": "ok", "correct": bool(c),
             "gold_loglik": -1.0, "gold_rank": 1 if c else 2, "prompt_tokens": 700}) + "\n"
            for i, c in enumerate(right)))
    assert main(["report", str(folder), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "4 paired questions" in md
    assert "| gold at 1 | 4 | 0 | 75.0 [" in md and "| gold at 5 | 4 | 0 | 25.0 [" in md
    assert "Middle penalty (edges minus middle), accuracy: +50.0 points" in md  # (75 + 75) / 2 - 25, by hand


def test_the_uncompressed_prompt_obeys_the_window_rule(tmp_path):
    lm = load_model(str(build_tiny_model(tmp_path / "short", max_positions=320)), device="cpu", reuse=False)
    df = CS.run(CS.CompressionConfig(num_docs=5, positions=(0,), budgets=(200,), strategies=("truncate",), limit=2,
                                     results_dir=str(tmp_path / "r"), progress=False), lm)
    none, cut = df[df["strategy"] == "none"], df[df["strategy"] == "truncate"]
    assert (none["prompt_tokens"] > 320).all() and set(none["status"]) == {"too_long"}
    assert none["correct"].isna().all() and none["gold_loglik"].isna().all()
    assert set(cut["status"]) == {"ok"} and (cut["prompt_tokens"] <= 200).all()


def test_every_item_is_made_once(tiny_lm, tmp_path, monkeypatch):
    """The first item of each condition is made before anything is written, then used, not made again (a
    compression's recorded seconds would otherwise come from its cache)."""
    from collections import Counter

    from litm.experiment import Sweep

    calls, real = Counter(), Sweep.item
    monkeypatch.setattr(Sweep, "item", lambda self, lm, c, u: calls.update([(c["condition"], c["position"], u.id)])
                        or real(self, lm, c, u))
    df = sweep(SweepConfig(task="kv", num_docs=4, positions=(0, 3), limit=3, batch_size=2,
                           results_dir=str(tmp_path), progress=False), tiny_lm)
    assert len(df) == len(calls) == 4 * 3 and set(calls.values()) == {1}


def test_the_file_hash_cache_forgets_deleted_files(tmp_path, monkeypatch):
    import shutil

    from litm.models import cache_root, local_weights

    monkeypatch.setenv("LITM_CACHE", str(tmp_path / "cache"))
    a, b = build_tiny_model(tmp_path / "a"), build_tiny_model(tmp_path / "b", seed=1)
    first = local_weights(a)
    assert local_weights(a) == first  # from the cache, the same digests
    shutil.rmtree(a)
    local_weights(b)
    cached = json.loads((cache_root().parent / "file-hashes.json").read_text())
    assert cached and all(k.startswith(str(b.resolve())) for k in cached)


def test_every_run_logs_its_first_prompt_and_the_chat_template(tmp_path):
    """The manifest holds the exact text the model saw for the run's first record (after chat wrapping), and
    the sha256 of the chat template, computed here from the tokenizer's own string."""
    import hashlib

    from litm.experiment import load_examples, prompt_for

    lm = load_model(str(build_tiny_model(tmp_path / "chat", chat=True)), device="cpu", dtype="float32", reuse=False)
    cfg = SweepConfig(task="qa", num_docs=3, positions=(0, 2), limit=2, sentences_per_doc=2, closedbook=False,
                      oracle=False, results_dir=str(tmp_path / "res"), progress=False)
    df = sweep(cfg, lm)
    for folder in (tmp_path / "res").iterdir():
        manifest = json.loads((folder / "manifest.json").read_text())
        logged = manifest["first_prompt"]
        first = json.loads((folder / "records.jsonl").read_text().splitlines()[0])
        position = int(df[df["config_hash"] == folder.name]["position"].iloc[0])
        example = next(e for e in load_examples(cfg) if e.id == first["example_id"])
        prompt = prompt_for(example, "documents", position, cfg, lm.tokenizer)
        assert logged["example_id"] == first["example_id"] and logged["text"] == prompt.text
        assert logged["text"].startswith("<|user|>") and logged["chat"] is True
        assert logged["input_ids_sha256"] == first["prompt_sha256"]
        assert logged["chat_template_sha256"] == hashlib.sha256(lm.tokenizer.chat_template.encode()).hexdigest()


def test_skip_leaves_out_the_first_examples_and_enters_the_hash_only_when_used(tmp_path):
    from litm.data import fictional_qa_records
    from litm.experiment import Sweep, load_examples
    from litm.study import config_hash

    ident = {"weights": "w", "dtype": "float32"}
    plain, skipped = Sweep(SweepConfig(task="qa", limit=5)), Sweep(SweepConfig(task="qa", limit=3, skip=2))
    # the run hashes computed before `skip` existed (main at e876a4f): earlier results keep their folders
    assert config_hash(plain.run_config(ident, plain.conditions()[0])) == "0d793cd32585112e"
    assert config_hash(S.Strategies(S.StrategyConfig(limit=5)).run_config(
        ident, {"arrangement": "rank", "variant": "after"})) == "91b8afeccda50dda"
    assert "skip" not in plain.hashed() and skipped.hashed()["skip"] == 2
    assert config_hash(skipped.run_config(ident, skipped.conditions()[0])) != config_hash(
        plain.run_config(ident, plain.conditions()[0]))
    # generated data: the same questions as the first five, less the first two
    assert load_examples(skipped.config) == load_examples(plain.config)[2:]
    assert [e.id for e in load_examples(skipped.config)] == ["fqa-s0-2", "fqa-s0-3", "fqa-s0-4"]
    # a data file: its records after the first `skip`
    path = write_jsonl(fictional_qa_records(5, 4), tmp_path / "f.jsonl")
    cfg = SweepConfig(task="qa", data=str(path), num_docs=4, positions=(0, 3), limit=2, skip=3)
    assert [e.id for e in load_examples(cfg)] == ["f.jsonl#4", "f.jsonl#5"]
    pools = S.load_pools(S.StrategyConfig(data=str(path), pool=4, k=2, oracle_positions=(), limit=None, skip=4))
    assert [e.id for e in pools] == ["f.jsonl#5"]
    assert [e.id for e in S.load_pools(S.StrategyConfig(limit=2, skip=1))] == ["fqa-s0-1", "fqa-s0-2"]
    with pytest.raises(ConfigError, match="holds 5 examples; skipping 5 leaves none"):
        load_examples(SweepConfig(task="qa", data=str(path), num_docs=4, positions=(0, 3), limit=None, skip=5))
    with pytest.raises(ConfigError, match="skip must be 0 or more"):
        SweepConfig(skip=-1)
