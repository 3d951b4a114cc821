"""Figures a reviewer accepts: the data set the axis range (a far baseline is a labelled mark at the edge), n in
every panel, a colour-blind-safe palette, and text of 8 points or more at the width the README shows them."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.colors as mcolors  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from litm.plots import OKABE_ITO, README_WIDTH_IN, position_curve  # noqa: E402


def _table(oracle_shift: float, closed_shift: float = 0.0):
    """Five questions at gold positions 0, 4, 9, closed-book and oracle; margins written out by hand."""
    margins = {0: [-1.0, -2.5, 0.5, -1.5, -2.0], 4: [-3.0, -4.5, -2.0, -4.0, -3.5], 9: [-2.0, -3.0, -1.0, -2.5, -1.5],
               "closedbook": [closed_shift + d for d in (-2.0, -1.0, -3.0, -2.5, -1.5)],
               "oracle": [oracle_shift + d for d in (-1.0, 0.0, 1.0, 0.5, -0.5)]}
    rows = []
    for key, ms in margins.items():
        for i, m in enumerate(ms):
            rows.append({"example_id": f"q{i}", "condition": key if isinstance(key, str) else "documents",
                         "position": None if isinstance(key, str) else key, "status": "ok", "scoring": "choice",
                         "correct": m > 0, "gold_loglik": -5.0 + m, "gold_margin": m, "prompt_tokens": 700})
    return pd.DataFrame(rows), margins


def _texts(ax):
    return [t.get_text() for t in ax.findobj(Text) if t.get_text()]


def displayed_points(fig) -> float:
    """The smallest text size in the figure, in points, once it is scaled to the README's width."""
    renderer = fig.canvas.get_renderer()
    width = fig.get_tightbbox(renderer).width  # inches, as savefig(bbox_inches="tight") writes it
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_text() and t.get_visible()]
    return min(sizes) * min(1.0, README_WIDTH_IN / width)


def test_a_far_oracle_is_a_labelled_mark_and_the_data_set_the_margin_axis():
    df, margins = _table(oracle_shift=80.0)
    fig = position_curve(df, chance=0.1, unit="key-value pair")
    acc, margin = fig.axes
    lo, hi = margin.get_ylim()
    means = [np.mean(margins[p]) for p in (0, 4, 9)]
    assert hi < 10 and lo > -12 and lo < min(means) and hi > max(means)  # the curve fills the panel
    assert not [ln for ln in margin.lines if ln.get_label() == "oracle"]
    mark = [t for t in _texts(margin) if t.startswith("oracle")]
    assert mark == [f"oracle: +{np.mean(margins['oracle']):.3g} ↑"]
    # the closed-book line lies among the data: a line, not a mark
    closed = [ln for ln in margin.lines if ln.get_label() == "closed-book"]
    assert closed and closed[0].get_ydata()[0] == pytest.approx(np.mean(margins["closedbook"]))
    # accuracy is bounded: every baseline there is a line, the axis is [0, 1]
    assert {"oracle", "closed-book", "chance"} <= {ln.get_label() for ln in acc.lines}
    assert acc.get_ylim() == pytest.approx((-0.02, 1.02))
    for ax in fig.axes:
        assert "Position of the gold key-value pair" in ax.get_xlabel()
        assert "n = 5 questions at each position" in ax.get_xlabel()


def test_a_far_baselines_mark_sits_clear_of_the_curve():
    df, margins = _table(oracle_shift=80.0, closed_shift=-80.0)  # one mark at the top, one at the bottom
    fig = position_curve(df)
    margin = fig.axes[1]
    fig.canvas.draw()
    band = [c for c in margin.collections if c.get_paths()]  # the interval band around the curve
    top_of_data = max(c.get_window_extent().y1 for c in band)
    bottom_of_data = min(c.get_window_extent().y0 for c in band)
    marks = {t.get_text()[0]: t.get_window_extent() for t in margin.texts}
    assert set(marks) == {"o", "c"}
    assert marks["o"].y0 >= top_of_data and marks["c"].y1 <= bottom_of_data


def test_a_near_oracle_stays_a_line_and_widens_the_axis_to_hold_it():
    df, margins = _table(oracle_shift=2.0)
    fig = position_curve(df)
    margin = fig.axes[1]
    oracle = [ln for ln in margin.lines if ln.get_label() == "oracle"]
    assert oracle and oracle[0].get_ydata()[0] == pytest.approx(np.mean(margins["oracle"]))
    assert margin.get_ylim()[1] > np.mean(margins["oracle"])
    assert "Position of the gold document" in margin.get_xlabel()


def test_position_curve_colours_come_from_the_okabe_ito_palette_and_text_is_8_points_at_readme_width():
    df, _ = _table(oracle_shift=80.0)
    fig = position_curve(df.assign(model=np.where(df["example_id"] < "q3", "a", "b")), label_by="model",
                         title="a title")
    data_lines = [ln for ln in fig.axes[1].lines if ln.get_marker() == "o"]
    assert [mcolors.to_hex(ln.get_color()) for ln in data_lines] == [c.lower() for c in OKABE_ITO[:2]]
    assert displayed_points(fig) >= 8
    fig.canvas.draw()
    legend = fig.axes[1].get_legend()
    assert legend.get_window_extent().y1 <= fig.axes[1].get_window_extent().y0  # below the data, not on it


def _measures(depths, acc, margin, oracle, closed):
    """A `diagnose.measures` table written by hand: five placements at measured depths, then the baselines."""
    rows = [{"condition": f"{p}%", "length": 1, "placement": i, "n": 20, "cases": 4, "accuracy": a,
             "ci_low": max(a - 0.2, 0), "ci_high": min(a + 0.2, 1), "margin": mg, "margin_low": mg - 1,
             "margin_high": mg + 1, "wrong_source": 0.3, "abstained": 0.1, "gold_region_depth": d}
            for i, (p, d, a, mg) in enumerate(zip((0, 25, 50, 75, 95), depths, acc, margin))]
    for cond, (a, mg) in (("oracle", oracle), ("closedbook", closed)):
        rows.append({"condition": cond, "length": 1, "placement": None, "n": 4, "cases": 4, "accuracy": a,
                     "ci_low": max(a - 0.3, 0), "ci_high": min(a + 0.3, 1), "margin": mg, "margin_low": mg - 1,
                     "margin_high": mg + 1, "wrong_source": 0.0, "abstained": 0.0, "gold_region_depth": np.nan})
    return pd.DataFrame(rows)


def test_diagnosis_plots_the_margin_at_measured_depths_with_both_baselines_visible():
    from litm.plots import diagnosis_curves

    depths = (0.0, 0.16, 0.48, 0.81, 0.97)
    a = _measures(depths, (0.2, 0.1, 0.3, 0.3, 0.3), (-2.0, -3.0, -2.5, -2.2, -1.5), oracle=(0.25, 40.0),
                  closed=(0.25, -2.4))  # oracle and closed-book at the same accuracy; the oracle's margin far off
    b = _measures(depths, (0.0, 0.0, 0.0, 0.0, 0.5), (-4.0, -4.5, -4.2, -3.0, 0.5), oracle=(1.0, 3.0),
                  closed=(0.5, -1.0))
    fig = diagnosis_curves([("model-a", a), ("model-b", b)], title="t")
    margin, acc = fig.axes[0], fig.axes[1]
    assert "margin" in margin.get_ylabel().lower() and "accuracy" in acc.get_ylabel().lower()
    labels = [t.get_text() for t in margin.get_xticklabels()]
    assert labels[:5] == ["0%", "16%", "48%", "81%", "97%"]  # where the gold was measured, not where it was aimed
    assert list(margin.lines[0].get_xdata()) == pytest.approx([100 * d for d in depths])
    lo, hi = margin.get_ylim()
    assert hi < 10 and lo <= -4.5  # the data (and model-b's oracle at +3) set the axis, not model-a's +40
    assert [t.get_text() for t in margin.texts] == ["+40\n↑"]
    # both baselines at 25% accuracy for model-a are drawn, in separate columns
    marks = {line.get_marker(): float(line.get_xdata()[0]) for line in acc.lines
             if line.get_marker() in ("D", "v") and line.get_color() == "#0072B2"}
    assert set(marks) == {"D", "v"} and abs(marks["D"] - marks["v"]) > 5
    for ax in fig.axes[2:4]:
        assert "n = 20 prompts per depth (4 cases)" in ax.get_xlabel()
    assert displayed_points(fig) >= 8


def test_floor_fonts_raises_small_text_on_a_wide_figure():
    import matplotlib.pyplot as plt

    from litm.plots import floor_fonts

    fig, ax = plt.subplots(figsize=(12, 3))
    ax.set_xlabel("small", fontsize=6)
    ax.plot([0, 1], [0, 1], label="line")
    ax.legend(fontsize=7)
    assert displayed_points(fig) < 8
    floor_fonts(fig)
    assert displayed_points(fig) >= 8 - 1e-6


def test_the_depth_length_heatmap_is_colour_blind_safe_and_says_each_cells_n():
    from litm.plots import depth_length_heatmap

    rng = np.random.default_rng(0)
    rows = [{"example_id": f"q{q}", "condition": "documents", "status": "ok", "target_length": L, "num_docs": n,
             "position": p, "correct": bool(rng.random() < 0.5), "gold_loglik": -3.0, "prompt_tokens": L}
            for L, n in ((250, 4), (500, 7)) for p in range(n) for q in range(3 if L == 250 else 5)]
    df = pd.DataFrame(rows)
    fig = depth_length_heatmap(df, depths=4)
    ax = fig.axes[0]
    assert ax.images[0].get_cmap().name == "cividis"
    texts = [t.get_text() for t in ax.texts]
    # depth 1/3 at 500 tokens (7 documents) is position round(2) = 2: five questions
    want = df[(df.target_length == 500) & (df.position == 2)].correct.mean()
    assert f"{100 * want:.0f}% (n=5)" in texts and sum(t.endswith("(n=3)") for t in texts) == 4
    assert displayed_points(fig) >= 8


def test_the_lever_forest_labels_its_panels_without_one_label_running_into_the_next():
    from litm.plots import lever_forest

    levers = ["shuffle", "u_shape", "attention_sort", "repeat", "extractive", "calibration", "rescaling",
              "channel_scaling", "parallel"]
    rows = [{"lever": lv, "measure": m, "estimand": e, "position": None, "n": 20, "change": c,
             "change_low": c - 1, "change_high": c + 1}
            for m, c in (("margin", -1.0), ("accuracy", 0.1)) for lv in levers
            for e in ("middle penalty", "mean over positions", "rank 1", "rank 5", "rank 10")]
    fig = lever_forest(pd.DataFrame(rows), title="Each lever minus the baseline")
    renderer = fig.canvas.get_renderer()
    boxes = [ax.xaxis.label.get_window_extent(renderer) for ax in fig.axes]
    assert len(boxes) == 2 and boxes[0].x1 <= boxes[1].x0  # the margin panel's label ends before the accuracy one's
    assert all("n = 20" in ax.get_xlabel() for ax in fig.axes)
    assert displayed_points(fig) >= 8


def test_each_models_n_is_named_when_the_models_differ_in_size():
    a, _ = _table(oracle_shift=0.0)
    b, _ = _table(oracle_shift=0.0)
    b = b[b["example_id"] != "q4"]  # one question fewer
    df = pd.concat([a.assign(model="big"), b.assign(model="small")], ignore_index=True)
    fig = position_curve(df, label_by="model")
    for ax in fig.axes:
        assert ax.get_xlabel().endswith("n at each position: 5 (big), 4 (small)")
