"""Every lever against the lost middle on the same questions (notebook 08): the baseline prompt, a random
shuffle (the control every reordering should beat), U-shape reordering, attention sorting, the question
repeated after the documents, extractive compression to a budget, and inside the model attention
calibration, positional rescaling, channel scaling and parallel documents (no position at all).  Each
question's gold sits at each position of the retrieved list; a reordering lever then moves the documents by
that rank, a compression lever shortens them, and an intervention changes the model.  Each lever is its own
run (an intervention's parameters join the model's run identity), and every lever's middle penalty is
compared with the baseline's, paired over questions."""
from __future__ import annotations

import functools
import hashlib
import time
from dataclasses import dataclass, replace

import numpy as np

from .errors import ConfigError, StatsError, check_distinct
from .models import DEFAULT_MODEL, LoadedModel, load_model
from .ordering import arrange, attention_sort, check_rounds, gold_at, random_order
from .prompts import Variant, render
from .runner import target
from .study import Item, Study
from .types import Example

LEVERS = ("baseline", "shuffle", "u_shape", "attention_sort", "repeat", "extractive", "calibration", "rescaling",
          "channel_scaling", "parallel")
INTERVENTIONS = ("calibration", "rescaling", "channel_scaling", "parallel")
BIASED = ("calibration", "rescaling")  # built from the positional bias `prepare` measures


@dataclass(frozen=True)
class LeverConfig:
    """The levers study on the generated fictional QA, scored by forced choice among every document's answer.
    Calibration and rescaling act in `layers` (default: the second half of the model's full-attention layers,
    as Found in the Middle's last 16 of 32) and take their positional bias from `bias_examples` held-out questions
    (2 measure each head's bias reproducibly on the default model: `interventions.calibration`).  Attention
    sorting reads the same layers' attention from the last token for `sort_rounds` rounds, on raw mass or (with
    `sort_calibrated`) on log mass minus that bias.  Channel scaling multiplies, in the same layers, the one
    channel most correlated with position on `channel_examples` held-out prompts by `channel_scale` (Yu et al.'s
    default 0).  The shuffle's seed is drawn per question from `seed`."""

    model: str = DEFAULT_MODEL
    num_docs: int = 10
    positions: tuple[int, ...] = (0, 4, 9)
    levers: tuple[str, ...] = LEVERS
    budget: int = 450  # extractive: prompt-token ceiling
    reserve: int = 32
    layers: tuple[int, ...] | None = None
    strength: float = 1.0  # calibration: 0 the plain model, 1 the positional logit bias removed
    sort_rounds: int = 2  # attention sorting: scoring passes before the prompt is scored
    sort_calibrated: bool = False
    channel_scale: float = 0.0  # channel scaling: 1 the plain model, 0 the channel removed (in [-1, 1])
    channel_examples: int = 4  # held-out prompts the positional channel is found on
    ratios: tuple[float, float] = (1.2, 1.8)  # rescaling: Ms-PoE's range
    bias_examples: int = 2
    bias_seed: int = 99
    limit: int = 12
    seed: int = 0
    sentences_per_doc: int = 3
    template: str = "ours"
    chat: bool | None = None
    batch_size: int = 4
    results_dir: str = "results"
    progress: bool = True

    def __post_init__(self):
        for name in ("positions", "levers", "ratios"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(int(i) for i in self.layers))
        check_distinct(positions=self.positions, levers=self.levers, layers=self.layers)
        bad = [x for x in self.levers if x not in LEVERS]
        if bad:
            raise ConfigError(f"unknown levers {bad}: use {list(LEVERS)}.")
        if "baseline" not in self.levers:
            raise ConfigError("the levers are compared with the baseline: keep 'baseline' in levers.")
        bad = [p for p in self.positions if not 0 <= p < self.num_docs]
        if bad:
            raise ConfigError(f"gold positions {bad} are out of range for {self.num_docs} documents.")
        if len(self.positions) < 3:
            raise ConfigError("a middle penalty needs at least three gold positions (first, middle, last).")
        if self.limit < 1 or self.bias_examples < 1 or self.channel_examples < 1:
            raise ConfigError("limit, bias_examples and channel_examples must be at least 1.")
        from .interventions import check_scale

        check_scale(self.channel_scale)
        check_rounds(self.sort_rounds, "sort_rounds")
        if len(self.ratios) != 2 or not 0 < self.ratios[0] <= self.ratios[1]:
            raise ConfigError(f"ratios must be (low, high) with 0 < low <= high, not {self.ratios}.")


@dataclass(frozen=True)
class Prepared:
    """What the intervention levers are built from, measured once per model: the positional bias (held-out
    questions) and the seconds and forward passes it took; for channel scaling, each layer's positional channel
    (`interventions.positional_channels`) and its seconds and passes."""

    bias: object
    layers: tuple[int, ...]
    seconds: float
    passes: int
    channels: object = None
    channel_seconds: float = 0.0
    channel_passes: int = 0


def prepare(config: LeverConfig, lm: LoadedModel) -> Prepared:
    """The positional bias of `lm` per layer and head on `config.bias_examples` held-out questions (another
    seed), each question's documents rotated through every position: examples x documents forward passes.  With
    the channel-scaling lever, also each layer's positional channel on `config.channel_examples` other held-out
    questions (the next seed), one pass each."""
    from .attention_study import position_bias
    from .data import generate_fictional_qa
    from .experiment import SweepConfig

    from .interventions import default_layers

    n_layers = lm.text_config.num_hidden_layers
    layers = config.layers if config.layers is not None else default_layers(lm)
    bad = [i for i in layers if not 0 <= i < n_layers]
    if bad:
        raise ConfigError(f"layers {bad} are outside the model's {n_layers} layers (0..{n_layers - 1}).")
    if not layers:
        raise ConfigError(f"every layer of {lm.name!r} attends through a sliding window; calibration needs layers "
                          "that attend over the whole prompt.")
    held = generate_fictional_qa(config.bias_examples, config.num_docs, config.bias_seed, config.sentences_per_doc)
    sweep_like = SweepConfig(task="qa", num_docs=config.num_docs, positions=(0,), limit=config.bias_examples,
                             template=config.template, chat=config.chat, progress=False)
    t0 = time.perf_counter()
    bias = position_bias(lm, sweep_like, held, progress=config.progress)
    seconds = time.perf_counter() - t0
    channels, channel_seconds, channel_passes = None, 0.0, 0
    if "channel_scaling" in config.levers:
        from .interventions import positional_channels

        t0 = time.perf_counter()
        others = generate_fictional_qa(config.channel_examples, config.num_docs, config.bias_seed + 1,
                                       config.sentences_per_doc)
        variant = Variant(template=config.template, chat=config.chat)
        channels = positional_channels(lm, [render(e, lm.tokenizer, variant) for e in others], layers)
        channel_seconds, channel_passes = time.perf_counter() - t0, len(others)
    return Prepared(bias, layers, seconds, len(held) * config.num_docs, channels, channel_seconds, channel_passes)


def _needs_prepared(config: LeverConfig) -> bool:
    return bool(set(config.levers) & {*BIASED, "channel_scaling"}) or (
        "attention_sort" in config.levers and config.sort_calibrated)


def _prepared(config: LeverConfig, lm: LoadedModel, prepared: Prepared | None) -> Prepared | None:
    """`prepared`, or measured now when a lever built from it is asked for and none was given."""
    if prepared is None and _needs_prepared(config):
        return prepare(config, lm)
    if prepared is not None and "channel_scaling" in config.levers and prepared.channels is None:
        raise ConfigError("this Prepared has no positional channels; measure it with prepare(config, lm) for a "
                          "config whose levers include 'channel_scaling'.")
    return prepared


def question_seed(seed: int, example_id: str) -> int:
    """The shuffle's seed for one question: the same at every gold position and in every run of `seed`."""
    return int(hashlib.sha256(f"{seed}:{example_id}".encode()).hexdigest()[:8], 16)


def intervention(lever: str, config: LeverConfig, lm: LoadedModel, prepared: Prepared):
    """The intervention a lever switches on (None for a prompt-level lever)."""
    from .attention_study import position_awareness
    from .interventions import (ParallelDocuments, PositionalRescaling, calibration, channel_scaling,
                                ratios_from_awareness)

    if lever == "parallel":
        return ParallelDocuments()
    if lever == "channel_scaling":  # one channel for every chosen layer, as Yu et al. scale it
        return channel_scaling(prepared.channels, config.channel_scale, prepared.layers, shared=True)
    if lever == "calibration":
        return calibration(prepared.bias, prepared.layers, config.strength)
    if lever == "rescaling":
        aware = position_awareness(prepared.bias, lm.text_config.num_key_value_heads)
        return PositionalRescaling(ratios_from_awareness(aware, *config.ratios), prepared.layers)
    return None


class Levers(Study):
    """One lever on the one loop: a condition per gold position."""

    kind = "levers"
    listing = ("positions", "levers")
    scoring = "choice"

    def __init__(self, config: LeverConfig, lever: str, prepared: Prepared | None = None):
        super().__init__(config)
        self.lever = lever
        self.variant = Variant(template=config.template, chat=config.chat, parallel=lever == "parallel")
        self.sort_bias = None
        if lever == "attention_sort" and config.sort_calibrated:
            if prepared is None:
                raise ConfigError("calibrated attention sorting needs the positional bias: pass prepare(config, lm).")
            from .attention_study import slot_bias

            self.sort_bias = [float(b) for b in slot_bias(prepared.bias, False)[list(prepared.layers)].mean(axis=(0, 1))]
        self.sort_layers = prepared.layers if prepared is not None else config.layers

    def hashed(self) -> dict:
        d = {**super().hashed(), "data": "generated-qa", "lever": self.lever}
        if self.lever != "extractive":
            d.pop("budget"), d.pop("reserve")
        if self.lever != "attention_sort":
            d.pop("sort_rounds"), d.pop("sort_calibrated")
        else:
            d["sort_layers"] = None if self.sort_layers is None else list(self.sort_layers)
            if self.sort_bias is not None:
                d["sort_bias"] = [round(b, 6) for b in self.sort_bias]
        if self.lever not in BIASED:  # their parameters enter through the model's run identity too
            d.pop("strength"), d.pop("ratios")
        if self.lever != "channel_scaling":
            d.pop("channel_scale"), d.pop("channel_examples")
        if self.lever not in (*BIASED, "channel_scaling"):
            d.pop("layers")
        if self.lever not in (*BIASED, "channel_scaling") and self.sort_bias is None:
            d.pop("bias_examples"), d.pop("bias_seed")
        return d

    def conditions(self) -> list[dict]:
        return [{"position": p} for p in self.config.positions]

    @functools.cache
    def units(self) -> list[Example]:
        from .data import generate_fictional_qa

        c = self.config
        return generate_fictional_qa(c.limit, c.num_docs, c.seed, c.sentences_per_doc)

    def prepare(self, lm, todo) -> None:
        if self.lever == "extractive":  # a budget the model cannot hold fails before anything runs
            from .compression import plan_budget

            plan_budget(lm, self.units()[0], self.variant, self.config.reserve, self.config.budget)

    def item(self, lm, condition: dict, example: Example) -> Item:
        from .compression import compress, plan_budget, survival

        p = condition["position"]
        e = gold_at(example, p)  # the gold at rank p + 1 of the retrieved list
        variant, seconds, shown, extra = self.variant, 0.0, e, {}
        if self.lever == "shuffle":
            seed = question_seed(self.config.seed, example.id)
            shown = replace(e, documents=tuple(random_order(e.documents, seed)))
            extra = {"shuffle_seed": seed}
        elif self.lever == "u_shape":
            shown = replace(e, documents=tuple(arrange(list(e.documents), "u_shape")))
        elif self.lever == "attention_sort":
            t0 = time.perf_counter()
            shown, orders = attention_sort(e, self._attend(lm), self.config.sort_rounds, self.sort_bias)
            seconds, extra = time.perf_counter() - t0, {"sort_orders": [list(o) for o in orders]}
        elif self.lever == "repeat":
            variant = replace(variant, repeat=True)
        elif self.lever == "extractive":
            budget = plan_budget(lm, e, variant, self.config.reserve, self.config.budget)
            c = compress(lm, e, budget, "extractive", variant)
            shown, seconds = c.example, c.seconds
        prompt = render(shown, lm.tokenizer, variant, allow_empty=True)
        fields = {"condition": f"{self.lever}:{p}", "lever": self.lever, "position": p, "seconds": round(seconds, 4),
                  **survival(e, shown), **extra}
        return Item(e.id, prompt, target(e, "choice"), fields)

    def _attend(self, lm):
        """Attention sorting's scorer, made once per study: each document's mass from the last token."""
        if getattr(self, "_attend_fn", None) is None:
            from .attention_study import document_masses
            from .interventions import default_layers

            self._attend_fn = document_masses(lm, self.variant, self.sort_layers or default_layers(lm))
        return self._attend_fn


def run(config: LeverConfig, model: LoadedModel | None = None, prepared: Prepared | None = None):
    """Run (or resume) every lever; one row per question, lever and gold position.  The intervention levers
    are built from `prepared` (default: `prepare(config, model)`, measured when one of them is asked for)."""
    import pandas as pd

    lm = model or load_model(config.model)
    prepared = _prepared(config, lm, prepared)
    from .interventions import intervene

    parts = []
    for lever in config.levers:
        with intervene(lm, intervention(lever, config, lm, prepared)):
            parts.append(Levers(config, lever, prepared).run(lm))
    return pd.concat(parts, ignore_index=True)


def _check(df, baseline: str = "baseline"):
    if baseline not in set(df["lever"]):
        raise StatsError(f"no records of the {baseline!r} lever to compare with; it holds {sorted(set(df['lever']))}.")


def by_position(df, measure: str = "margin"):
    """Each lever's mean at each gold position on a measure, with a t 95% interval (accuracy: Wilson)."""
    import pandas as pd

    from . import stats

    m = stats.measure(measure)
    rows = []
    ok = df[df["status"] == "ok"]
    for (lever, p), g in ok.groupby(["lever", "position"], sort=False):
        v = g[m.column].astype(float)
        mean, lo, hi = stats.proportion_interval(v) if m.binary else stats.mean_interval(v.to_numpy())
        rows.append({"lever": lever, "position": int(p), "measure": m.name, "n": len(g), "mean": mean, "ci_low": lo,
                     "ci_high": hi})
    return pd.DataFrame(rows)


def _wide(df, measure: str):
    """Questions x (lever, position) on a measure; questions without a score under every one left out."""
    from . import stats

    ok = df[df["status"] == "ok"]
    wide = ok.pivot_table(index="example_id", columns=["lever", "position"], values=stats.measure(measure).column,
                          aggfunc="first")
    return wide.astype(float).dropna()


def penalties(df, measure: str = "margin", overall: bool = False):
    """Questions x levers: each question's middle penalty (edge positions averaged, minus the middle) under
    each lever on a measure, or with `overall` its mean over the positions; questions without a score under
    every lever and position are left out."""
    import pandas as pd

    from . import stats

    wide = _wide(df, measure)
    positions = sorted(set(df["position"]))
    edges, middle = stats.edges_and_middle(positions)
    levers = list(dict.fromkeys(df["lever"]))
    if overall:
        return pd.DataFrame({lv: wide[[(lv, p) for p in positions]].mean(axis=1) for lv in levers})
    return pd.DataFrame({lv: wide[[(lv, p) for p in edges]].mean(axis=1) - wide[[(lv, p) for p in middle]].mean(axis=1)
                         for lv in levers})


def penalty_changes(df, measures=("margin", "accuracy"), baseline: str = "baseline"):
    """Each lever against the baseline, paired over questions, per measure, as one row per lever, measure and
    estimand: the change in the middle penalty (below 0 the lever flattens the position curve), the change at
    each gold position (`position`, 0-based; a curve also flattens when its edges fall, so the middle's own
    change says whether the middle rose), and the change in the mean over the positions.  Each row has the
    lever's and the baseline's own value, the change with its t 95% interval, and the paired t and Wilcoxon
    p-values; only questions scored under every lever and position count."""
    import pandas as pd

    from . import stats

    _check(df, baseline)
    rows = []
    for name in measures:
        m = stats.measure(name)
        wide = _wide(df, m.name)
        if len(wide) < 2:
            raise StatsError(f"fewer than two questions have a {m.label} under every lever and position.")
        positions = sorted(set(df["position"]))
        estimands = [("middle penalty", None, penalties(df, m.name)), ("mean over positions", None,
                                                                        penalties(df, m.name, overall=True))]
        estimands += [(f"rank {p + 1}", p, pd.DataFrame({lv: wide[(lv, p)] for lv in dict.fromkeys(df["lever"])}))
                      for p in positions]
        for estimand, position, table in estimands:
            for lever in table.columns:
                if lever == baseline:
                    continue
                est = stats.difference(stats.PairedTable(tuple(table.index), tuple(table.columns), table.to_numpy()),
                                       lever, baseline)
                t, w = stats.paired_tests(table[lever].to_numpy(), table[baseline].to_numpy(), False)
                rows.append({"lever": lever, "measure": m.name, "estimand": estimand, "position": position,
                             "n": est.n, "value": float(table[lever].mean()), "baseline": float(table[baseline].mean()),
                             "change": est.value, "change_low": est.low, "change_high": est.high,
                             "p_t": t.p_value, "p_wilcoxon": w.p_value})
    out = pd.DataFrame(rows)
    out["position"] = out["position"].astype("Int64")
    return out


def timed(config: LeverConfig, lm: LoadedModel, prepared: Prepared | None = None, rounds: int = 3):
    """Seconds to score one prompt (the first question, the gold at the middle rank) under each lever, side by
    side: the levers in turn, after an untimed warm-up round, `rounds` times, each timed between device
    synchronisations; the median per lever, and the seconds it took to make the prompt (`prompt_s`: compression
    or attention sorting, made once, outside the timing).
    Records' own latencies follow the run's order and batches, so they do not compare levers fairly."""
    import statistics

    import pandas as pd

    from .interventions import intervene
    from .models import synchronize
    from .runner import score
    from .stats import edges_and_middle

    prepared = _prepared(config, lm, prepared)
    middle = edges_and_middle(config.positions)[1][0]
    made = {}
    for lever in config.levers:
        study = Levers(config, lever, prepared)
        made[lever] = (study.item(lm, {"position": middle}, study.units()[0]),
                       intervention(lever, config, lm, prepared))
    seconds: dict[str, list[float]] = {lever: [] for lever in config.levers}
    for r in range(rounds + 1):
        for lever, (it, iv) in made.items():
            with intervene(lm, iv):
                synchronize(lm.device)
                t0 = time.perf_counter()
                score(lm, [it.prompt], [it.target], "choice")
                synchronize(lm.device)
                if r:
                    seconds[lever].append(time.perf_counter() - t0)
    return pd.DataFrame([{"lever": lever, "scoring_s": statistics.median(v), "prompt_s": made[lever][0].fields["seconds"],
                          "rounds": rounds} for lever, v in seconds.items()])


def costs(df, timing, prepared: Prepared | None = None, baseline: str = "baseline"):
    """What each lever costs per prompt against the baseline: extra forward passes per prompt (attention
    sorting's rounds, from its records' orders; forced choice is one prefill and one pass over the candidates
    under every lever), prompt tokens (the records' mean), seconds of scoring and of making the prompt (`timing`,
    from `timed`), and the one-off passes and seconds of the positional bias the levers built from it need."""
    import pandas as pd

    _check(df, baseline)
    ok = df[df["status"] == "ok"]
    t = timing.set_index("lever")
    if baseline not in t.index:
        raise StatsError(f"the timing has no {baseline!r} lever; time the same levers as the records.")
    total = t["scoring_s"] + t["prompt_s"]
    base_tokens = ok.loc[ok["lever"] == baseline, "prompt_tokens"].mean()
    rows = []
    for lever, g in ok.groupby("lever", sort=False):
        sorted_ = lever == "attention_sort" and "sort_orders" in g
        one_off = prepared is not None and (lever in BIASED or (sorted_ and "sort_bias" in g["sweep_config"].iloc[0]))
        channel = prepared is not None and lever == "channel_scaling"
        rows.append({"lever": lever, "n": len(g),
                     "extra_passes_per_prompt": float(g["sort_orders"].map(len).mean() - 1) if sorted_ else 0,
                     "prompt_tokens": float(g["prompt_tokens"].mean()),
                     "tokens_vs_baseline": float(g["prompt_tokens"].mean() / base_tokens),
                     "seconds_per_prompt": float(total[lever]), "seconds_vs_baseline": float(total[lever] / total[baseline]),
                     "one_off_passes": prepared.passes if one_off else prepared.channel_passes if channel else 0,
                     "one_off_seconds": round(prepared.seconds if one_off else prepared.channel_seconds if channel
                                              else 0.0, 1)})
    return pd.DataFrame(rows)


def question_changes(df, lever: str, measure: str = "margin", baseline: str = "baseline",
                     position: int | None = None) -> np.ndarray:
    """Each question's change under `lever` against the baseline: in the middle penalty, or with `position` at
    that gold position (for `planning.plan` and `planning.conclusion`)."""
    if position is None:
        pen = penalties(df, measure)
        return (pen[lever] - pen[baseline]).to_numpy()
    wide = _wide(df, measure)
    return (wide[(lever, position)] - wide[(baseline, position)]).to_numpy()


def describe(changes, lever: str, measure: str = "margin") -> str:
    """One sentence from `penalty_changes` for a lever against the baseline on a measure: the change in the
    middle penalty and at every gold position (the middle's own change first among them: it says whether the
    middle rose or the edges fell), and in the mean over the positions, each with its t interval and p."""
    from . import stats

    m = stats.measure(measure)
    rows = changes[(changes["lever"] == lever) & (changes["measure"] == m.name)].set_index("estimand")
    if rows.empty:
        raise StatsError(f"no {m.label} changes for {lever!r}; the table holds {sorted(set(changes['lever']))}.")

    def part(name: str) -> str:
        r = rows.loc[name]
        return (f"{name} {m.format(r['change'], True)} [{m.format(r['change_low'], True)}, "
                f"{m.format(r['change_high'], True)}] (from {m.format(r['baseline'])}, t p = {r['p_t']:.2g})")

    ranks = rows[rows["position"].notna()].sort_values("position")
    _, middle = stats.edges_and_middle([int(p) for p in ranks["position"]])
    mid = [f"rank {p + 1}" for p in middle]
    others = [name for name in ranks.index if name not in mid]
    return (f"{lever} minus the baseline on the {m.label} ({m.unit}, 95% paired t intervals, "
            f"n = {int(rows['n'].max())} questions): " + "; ".join(
                [part("middle penalty")] + [f"the middle, {part(n)}" for n in mid] + [part(n) for n in others]
                + [part("mean over positions")]) + ".")
