"""A live explorer for teaching (notebook 00): choose a question, move its gold document with a slider, and
see the prompt with the gold highlighted, the attention the last prompt token pays each document, and the
gold answer's log-likelihood and rank among the documents' answers.  Each move renders the prompt and runs
the model over it once: the attention profile's pass, whose cache then scores the candidate answers.  Where
widgets are not rendered (headless, a static viewer) the same view is shown as HTML."""
from __future__ import annotations

import html
import time
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError
from .models import LoadedModel
from .prompts import Prompt, Variant, render
from .stats import edges_and_middle
from .types import Example


@dataclass(frozen=True)
class View:
    """One question with its gold document at `position` (0-based): the prompt, the attention on each document
    (mass from the last prompt token, averaged over layers and heads), and the forced choice's outcome."""

    example: Example
    position: int
    prompt: Prompt
    attention: np.ndarray  # [document], in prompt order
    gold_loglik: float
    gold_rank: int
    candidates: int
    seconds: float


def look(lm: LoadedModel, example: Example, position: int, variant: Variant = Variant()) -> View:
    """The view of `example` with its gold moved to `position` (0-based), from one forward pass over the prompt
    (the attention profile, whose KV cache and last logits then score the candidate answers)."""
    import torch

    from .attention import profile
    from .ordering import gold_at
    from .runner import candidates, choice_after, float32_logits, returned_cache

    n = len(example.documents)
    if not 0 <= position < n:
        raise ConfigError(f"position {position} is outside the question's {n} documents (0..{n - 1}).")
    t0 = time.perf_counter()
    e = gold_at(example, position)
    prompt = render(e, lm.tokenizer, variant)
    cands, gold = candidates(e)
    with float32_logits(lm), torch.inference_mode():
        prof, out = profile(lm, prompt, queries="last", keep_cache=True)
        scored = choice_after(lm, prompt, returned_cache(out), out.logits[0, -1], cands, gold)
    return View(e, position, prompt, prof.documents.mean(axis=(0, 1)), scored.gold_loglik, scored.gold_rank,
                len(cands), time.perf_counter() - t0)


def to_html(view: View) -> str:
    """The view as HTML: a line of numbers, a bar per document (the gold's in orange), and the prompt with the
    gold document highlighted."""
    gold = view.prompt.manifest.gold_index
    top = max(float(view.attention.max()), 1e-12)
    bars = []
    for i, a in enumerate(view.attention):
        color = "#e6730f" if i == gold else "#4c78a8"
        bars.append(f'<div style="display:flex;align-items:center;gap:6px;font:12px monospace">'
                    f'<span style="width:5em">doc {i + 1}{" *" if i == gold else ""}</span>'
                    f'<span style="display:inline-block;height:10px;width:{300 * a / top:.0f}px;background:{color}">'
                    f'</span><span>{a:.4f}</span></div>')
    text = view.prompt.text
    s, e = view.prompt.manifest.doc_char_spans[gold]
    shown = (html.escape(text[:s]) + '<mark style="background:#ffd8a8">' + html.escape(text[s:e]) + "</mark>"
             + html.escape(text[e:]))
    head = (f"<b>{html.escape(view.example.question)}</b><br>gold document at position {view.position + 1} of "
            f"{len(view.attention)}: gold answer log-likelihood {view.gold_loglik:.2f} nats, rank {view.gold_rank} "
            f"of {view.candidates} answers ({view.seconds:.1f} s)")
    return (f"<div>{head}<div style='margin:6px 0'>attention from the last prompt token (layers and heads "
            f"averaged):{''.join(bars)}</div><pre style='max-height:260px;overflow:auto;white-space:pre-wrap;"
            f"font-size:11px'>{shown}</pre></div>")


class Explorer:
    """The widgets (a question menu, a position slider, the view) over `examples`; moving either recomputes the
    view.  Displayed in a notebook it is the live widget, or the current view as HTML where widgets are not
    rendered.  `question` and `slider` can be set from code as by hand."""

    def __init__(self, lm: LoadedModel, examples, variant: Variant = Variant()):
        import ipywidgets as w

        self.lm, self.examples, self.variant = lm, list(examples), variant
        if not self.examples:
            raise ConfigError("the explorer needs at least one question.")
        n = len(self.examples[0].documents)
        if any(len(e.documents) != n for e in self.examples):
            raise ConfigError("give questions with the same number of documents (the slider spans them).")
        self.question = w.Dropdown(options=[(e.question, i) for i, e in enumerate(self.examples)], value=0,
                                   description="question", layout=w.Layout(width="95%"))
        self.slider = w.IntSlider(value=n // 2 + 1, min=1, max=n, description="gold at", continuous_update=False)
        self.output = w.HTML()
        self.widget = w.VBox([self.question, self.slider, self.output])
        self.view: View | None = None
        self.question.observe(self._update, names="value")
        self.slider.observe(self._update, names="value")
        self._update()

    def _update(self, *_):
        self.view = look(self.lm, self.examples[self.question.value], self.slider.value - 1, self.variant)
        self.output.value = to_html(self.view)

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        data = dict(data or {})
        data["text/html"] = to_html(self.view)  # what a frontend without widgets shows
        return data


def places(lm: LoadedModel, examples, positions=None, variant: Variant = Variant()):
    """Every question of the tour with its gold moved to each of `positions` (0-based; default the first, the
    middle and the last document, notebook 02's places): one row per question and place with the gold answer's
    log-likelihood and rank, and the attention on the gold document beside the documents' mean."""
    import pandas as pd

    rows = []
    for e in examples:
        n = len(e.documents)
        for p in positions if positions is not None else (0, (n - 1) // 2, n - 1):
            v = look(lm, e, p, variant)
            rows.append({"example_id": e.id, "position": p, "gold_loglik": v.gold_loglik, "gold_rank": v.gold_rank,
                         "candidates": v.candidates, "gold_attention": float(v.attention[p]),
                         "mean_attention": float(v.attention.mean())})
    return pd.DataFrame(rows)


def describe_places(table) -> str:
    """The tour's result in words, from `places`: at each place how often the gold ranked first and its mean
    log-likelihood, whether the middle (`stats.edges_and_middle`, the one meaning of it) was the worst place, and
    why a handful of questions only shows it."""
    n = table["example_id"].nunique()
    by = {int(p): g for p, g in table.groupby("position")}
    parts = [f"with the gold at {p + 1} it ranked first in {int((g['gold_rank'] == 1).sum())} of {len(g)} "
             f"(mean log-likelihood {g['gold_loglik'].mean():.2f} nats)" for p, g in by.items()]
    text = f"Over the tour's {n} questions, " + "; ".join(parts) + "."
    if len(by) >= 3:
        means = {p: g["gold_loglik"].mean() for p, g in by.items()}
        worst = min(means, key=means.get)
        text += (f" The middle is the worst place here (lowest log-likelihood with the gold at {worst + 1}), the shape "
                 "the paper reports." if worst in edges_and_middle(list(means))[1] else
                 f" Here the middle is not the worst place: the lowest log-likelihood is with the gold at {worst + 1}.")
    return text + (f" With {n} questions this shows the effect happening, it does not measure it: notebook 02 asks "
                   "the same of many questions, paired, with an interval.")
