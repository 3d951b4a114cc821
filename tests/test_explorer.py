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
from litm.explorer import Explorer, look, to_html
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
