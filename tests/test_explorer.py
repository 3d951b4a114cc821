"""The teaching explorer on a tiny model: each move shows the prompt with the gold highlighted, the attention
per document and the forced choice's outcome (from one pass over the prompt), the same as the profile and
the runner compute them separately; the
widgets can be driven from code; a frontend without widgets gets the HTML."""
import html

import numpy as np
import pytest

from litm import runner
from litm.attention import profile
from litm.data import generate_fictional_qa
from litm.errors import ConfigError
from litm.explorer import Explorer, describe_places, look, places, to_html
from litm.ordering import gold_at
from litm.prompts import Variant, render


@pytest.fixture(scope="module")
def examples():
    return generate_fictional_qa(2, 4, seed=3, sentences_per_doc=2)


def test_a_view_is_the_prompt_attention_and_choice_at_that_position(tiny_lm, examples):
    v = look(tiny_lm, examples[0], 2)
    e = gold_at(examples[0], 2)
    prompt = render(e, tiny_lm.tokenizer, Variant())
    assert v.prompt.input_ids == prompt.input_ids and v.prompt.manifest.gold_index == 2
    np.testing.assert_allclose(v.attention, profile(tiny_lm, prompt).documents.mean(axis=(0, 1)), atol=1e-7)
    cands, gold = runner.candidates(e)
    s = runner.choice(tiny_lm, [prompt], [cands], [gold])[0]  # another route: the runner's own prefill
    assert (v.gold_loglik, v.gold_rank, v.candidates) == (pytest.approx(s.gold_loglik, abs=1e-4), s.gold_rank,
                                                          len(cands))
    page = to_html(v)
    s_, e_ = prompt.manifest.doc_char_spans[2]
    assert f"<mark style=\"background:#ffd8a8\">{html.escape(prompt.text[s_:e_])}</mark>" in page
    assert "doc 3 *" in page and f"rank {v.gold_rank} of {len(cands)}" in page
    with pytest.raises(ConfigError, match="outside the question's 4 documents"):
        look(tiny_lm, examples[0], 4)


def test_the_widgets_move_the_gold_when_driven_from_code(tiny_lm, examples):
    ui = Explorer(tiny_lm, examples)
    assert ui.slider.value == 3 and ui.view.position == 2  # starts in the middle (1-based slider)
    ui.slider.value = 1
    assert ui.view.position == 0 and ui.view.prompt.manifest.gold_index == 0
    assert ui.output.value == to_html(ui.view)
    ui.question.value = 1
    assert ui.view.example.id == gold_at(examples[1], 0).id and examples[1].question in ui.output.value
    bundle = ui._repr_mimebundle_()
    assert bundle["text/html"] == to_html(ui.view) and "application/vnd.jupyter.widget-view+json" in bundle
    with pytest.raises(ConfigError, match="same number of documents"):
        Explorer(tiny_lm, [examples[0], generate_fictional_qa(1, 5, seed=1)[0]])


def test_the_tour_table_is_one_look_per_question_and_place(tiny_lm, examples):
    table = places(tiny_lm, examples)
    assert list(table["position"]) == [0, 1, 3] * len(examples)  # first, middle ((4 - 1) // 2) and last of 4
    v = look(tiny_lm, examples[1], 3)
    row = table[(table["example_id"] == examples[1].id) & (table["position"] == 3)].iloc[0]
    assert (row["gold_loglik"], row["gold_rank"]) == (pytest.approx(v.gold_loglik, abs=1e-5), v.gold_rank)
    assert row["gold_attention"] == pytest.approx(v.attention[3], abs=1e-7)


def test_the_tour_in_words_counts_first_ranks_and_names_the_worst_place():
    import pandas as pd

    # planted: two questions; the middle is worst on average (-3.0 against -1.0 and -2.0)
    table = pd.DataFrame({"example_id": ["a", "a", "a", "b", "b", "b"], "position": [0, 4, 9] * 2,
                          "gold_loglik": [-1.0, -2.0, -1.5, -1.0, -4.0, -2.5], "gold_rank": [1, 2, 1, 3, 4, 1]})
    text = describe_places(table)
    assert "gold at 1 it ranked first in 1 of 2 (mean log-likelihood -1.00 nats)" in text
    assert "gold at 5 it ranked first in 0 of 2 (mean log-likelihood -3.00 nats)" in text
    assert "gold at 10 it ranked first in 2 of 2" in text and "The middle is the worst place here" in text
    last_worst = table.assign(gold_loglik=[-1.0, -2.0, -5.0, -1.0, -2.0, -5.0])
    assert "the lowest log-likelihood is with the gold at 10" in describe_places(last_worst)
