"""Diagnose position sensitivity on your own RAG prompts (notebook 07, `python -m litm diagnose`).

For each case (a question, its accepted answers, the documents as they went into the prompt and the id of
the one that holds the answer) the gold document is placed at fixed relative depths of the document region
while everything else stays: the same question, evidence and distractors, so the prompt length barely
moves.  The model answers; the answers are scored, and a rule-based verdict names the likeliest cause:
packing/truncation, position (lost in the middle, primacy or recency), a reasoning or evidence problem,
interference or length.

One job per module: `cases` (reading a user's cases), `design` (the config and the Latin-square design),
`study` (running it on the one loop, scoring answers), `analysis` (measures and placement effects),
`verdict` (the rules, the comparison of two models) and `report` (markdown and figure).
"""
from .analysis import (adjacency_counts, case_effects, case_table, length_spread, measures, placement_effects,
                       trend_weights)
from .cases import case_from_record, read_cases, with_adversarial
from .design import DEPTHS, DiagnoseConfig, Trial, design, latin_rows, neighbours, prepare_cases, slots_for, trials_for
from .report import position_lines, to_markdown, write_report
from .study import ABSTAIN_ANSWER, DiagnoseStudy, choices, run, score_answer, score_choice
from .verdict import Diagnosis, Rule, compare_models, diagnose

