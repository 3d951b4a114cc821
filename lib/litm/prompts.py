"""Render an example as a prompt: its text, token ids and a manifest of where every document sits.

Templates follow the structure of Liu et al.'s prompt files (same names and placeholders) but are
worded by us.  With `template="paper"` the paper's own files (downloaded by `litm fetch liu2023`)
are used verbatim.  When the model's tokenizer has a chat template, the prompt becomes the user
turn and the assistant turn is opened.
"""
from __future__ import annotations

import hashlib
import string
from xml.sax.saxutils import escape, quoteattr
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError, DataError
from .types import Example

_QA_INSTRUCTION = ("Use only the search results below to answer the question. "
                   "Some of the search results may not be relevant to it.")
_KV_INSTRUCTION = "The JSON object below maps keys to values. Find the value stored under the given key.\n\n"
_CITE = " After the answer, give the number of the search result it comes from in square brackets, like [2]."
_QA_LAYOUTS = {
    "qa": "{instruction}\n\n{{search_results}}\n\nQuestion: {{question}}\nAnswer:",
    "qa_with_query_aware_contextualization":
        "{instruction}\n\nQuestion: {{question}}\n\n{{search_results}}\n\nQuestion: {{question}}\nAnswer:",
    "qa_with_grounded_repeat": ("{instruction}\n\nQuestion: {{question}}\n\n{{search_results}}\n\n"
                                "Answer from the search results above only, not from memory.\n"
                                "Question: {{question}}\nAnswer:"),
}
OUR_TEMPLATES = {
    **{name: layout.format(instruction=_QA_INSTRUCTION) for name, layout in _QA_LAYOUTS.items()},
    **{f"{name}_with_citations": layout.format(instruction=_QA_INSTRUCTION + _CITE)
       for name, layout in _QA_LAYOUTS.items()},
    "closedbook_qa": "Answer the question below.\n\nQuestion: {question}\nAnswer:",
    "kv_retrieval": _KV_INSTRUCTION + 'JSON data:\n{formatted_kv_records}\n\nKey: "{key}"\nCorresponding value:',
    "kv_retrieval_with_query_aware_contextualization":
        _KV_INSTRUCTION + 'Key: "{key}"\n\nJSON data:\n{formatted_kv_records}\n\nKey: "{key}"\nCorresponding value:',
    "closedbook_kv_retrieval": 'Give the value stored under the key below.\n\nKey: "{key}"\nCorresponding value:',
}
DOC_FORMATS = ("paper", "xml")
PAPER_TEMPLATE_DIR = Path("src") / "lost_in_the_middle" / "prompts"
CONDITIONS = ("documents", "closedbook", "oracle")
_SENTINEL = "\x00LITM-USER-CONTENT\x00"


@dataclass(frozen=True)
class Variant:
    """How to render: which condition, question placement, template family and chat wrapping."""

    condition: str = "documents"  # documents | closedbook | oracle
    query_aware: bool = False  # question before and after the documents
    repeat: bool = False  # QA: question before, and after the documents again with a grounding instruction
    doc_format: str = "paper"  # QA: "paper" (Document [i](Title: ...) lines) or "xml" (<document ...> elements)
    cite: bool = False  # QA: ask for the number of the supporting document in brackets after the answer
    template: str = "ours"  # ours | paper
    template_dir: str = "data/liu2023"  # where `litm fetch liu2023` put the paper's files
    chat: bool | None = None  # None: use the tokenizer's chat template when it has one
    template_text: str | None = None  # QA: the user's own template (check_template), used for every condition
    parallel: bool = False  # documents as unnumbered blocks, each tokenized alone (litm.parallel scores them)


@dataclass(frozen=True)
class Manifest:
    """Where everything sits in the prompt's tokens (half-open [start, end) spans)."""

    doc_ids: tuple[str, ...]
    doc_spans: tuple[tuple[int, int], ...]
    doc_char_spans: tuple[tuple[int, int], ...]
    gold_index: int | None  # position of the gold document in this prompt, None when absent
    question_spans: tuple[tuple[int, int], ...]
    num_tokens: int
    sha256: str  # of the token ids
    template: str
    chat: bool
    doc_format: str = "paper"  # how the documents are written (Variant.doc_format)
    parallel: bool = False  # the documents are blocks tokenized alone that tile doc_spans (Variant.parallel)

    @property
    def gold_span(self) -> tuple[int, int] | None:
        return None if self.gold_index is None else self.doc_spans[self.gold_index]

    @property
    def gold_rel_depth(self) -> float | None:
        """The gold document's first token as a fraction of the prompt (0 = start, 1 = end)."""
        span = self.gold_span
        return None if span is None else span[0] / self.num_tokens

    def to_dict(self) -> dict:
        return {"doc_ids": list(self.doc_ids), "doc_spans": [list(s) for s in self.doc_spans],
                "gold_index": self.gold_index, "gold_span": list(self.gold_span) if self.gold_span else None,
                "gold_rel_depth": self.gold_rel_depth, "question_spans": [list(s) for s in self.question_spans],
                "num_tokens": self.num_tokens, "sha256": self.sha256, "template": self.template,
                "chat": self.chat, "doc_format": self.doc_format, **({"parallel": True} if self.parallel else {})}


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt: text, token ids and manifest, for one example under one variant."""

    example_id: str
    text: str
    input_ids: tuple[int, ...]
    manifest: Manifest

    def continuation(self, answer: str) -> str:
        """The text an answer is scored as: after a space, unless the prompt ends in whitespace."""
        return answer if (not self.text or self.text[-1].isspace()) else " " + answer


def template_name(task: str, variant: Variant) -> str:
    if task == "qa":
        if variant.condition == "closedbook":
            return "closedbook_qa"
        if variant.repeat and variant.query_aware:
            raise ConfigError("repeat already puts the question before and after the documents; drop query_aware.")
        name = ("qa_with_grounded_repeat" if variant.repeat else
                "qa_with_query_aware_contextualization" if variant.query_aware else "qa")
        return name + ("_with_citations" if variant.cite else "")
    if task == "kv":
        if variant.repeat or variant.cite or variant.doc_format != "paper":
            raise ConfigError("repeat, cite and doc_format apply to QA prompts only.")
        if variant.condition == "closedbook":
            return "closedbook_kv_retrieval"
        return "kv_retrieval_with_query_aware_contextualization" if variant.query_aware else "kv_retrieval"
    raise ConfigError(f"unknown task {task!r}: use 'qa' or 'kv'.")


def check_template(text: str, source: str = "the template") -> str:
    """A user's QA template: it must hold {search_results} and {question} and no other field (write a
    literal brace as {{ or }}).  Returns the text."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as exc:
        raise ConfigError(f"{source}: not a valid template ({exc}); write literal braces as {{{{ and }}}}.") from None
    missing = [f for f in ("search_results", "question") if f not in fields]
    if missing:
        raise ConfigError(f"{source} lacks the placeholder(s) {', '.join('{' + f + '}' for f in missing)}: put "
                          "{search_results} where the documents go and {question} where the question goes.")
    unknown = sorted(set(fields) - {"search_results", "question"})
    if unknown:
        raise ConfigError(f"{source} has placeholder(s) {', '.join('{' + f + '}' for f in unknown)} we cannot fill; "
                          "only {search_results} and {question} are filled (write literal braces as {{ and }}).")
    return text


def load_template(name: str, variant: Variant) -> str:
    """Our template, or the paper's file read as the paper reads it (trailing newlines dropped)."""
    if variant.template_text is not None:
        if not name.startswith(("qa", "closedbook_qa")):
            raise ConfigError("a template of your own is for QA prompts only.")
        return check_template(variant.template_text)
    if variant.template == "ours":
        return OUR_TEMPLATES[name]
    if variant.template != "paper":
        raise ConfigError(f"unknown template family {variant.template!r}: use 'ours' or 'paper'.")
    if name == "closedbook_kv_retrieval":
        raise ConfigError("the paper has no closed-book KV prompt; use template='ours' for that condition.")
    if name.startswith("qa_with_grounded_repeat") or name.endswith("_with_citations"):
        raise ConfigError(f"the paper has no {name!r} prompt (repeat and cite are ours); use template='ours'.")
    path = Path(variant.template_dir) / PAPER_TEMPLATE_DIR / f"{name}.prompt"
    if not path.is_file():
        raise DataError(f"{path}: the paper's template is missing. Run `python -m litm fetch liu2023` "
                        f"(it downloads the templates) or use template='ours'.")
    return path.read_text(encoding="utf-8").rstrip("\n")


def _fill(template: str, values: dict[str, tuple[str, list[tuple[int, int]]]]):
    """Format `template`; returns the text, the offset of each field occurrence, and the inner spans
    (given relative to a field's value) shifted to absolute character offsets."""
    out, fields, inner, pos = [], {}, [], 0
    for literal, field, spec, conv in string.Formatter().parse(template):
        out.append(literal)
        pos += len(literal)
        if field is None:
            continue
        if field not in values or spec or conv:
            raise ConfigError(f"template field {{{field}}} is not one we can fill (we fill {sorted(values)}).")
        value, spans = values[field]
        fields.setdefault(field, []).append((pos, pos + len(value)))
        if spans and len(fields[field]) == 1:
            inner = [(pos + s, pos + e) for s, e in spans]
        out.append(value)
        pos += len(value)
    return "".join(out), fields, inner


def _join(items: list[str], sep: str, lead: str = "", tail: str = "") -> tuple[str, list[tuple[int, int]]]:
    """`lead + sep.join(items) + tail`, and the character span of each item in it."""
    spans, pos = [], len(lead)
    for item in items:
        spans.append((pos, pos + len(item)))
        pos += len(item) + len(sep)
    return lead + sep.join(items) + tail, spans


def _format_documents(example: Example, doc_format: str = "paper",
                      parallel: bool = False) -> tuple[str, list[tuple[int, int]]]:
    """The documents' text and each one's character span.  `parallel`: no document numbers (every document
    sits at the same positions, so a number would be the only thing that tells them apart) and each block
    ends with its separator, so the blocks tile the documents' text and read the same in any order."""
    if doc_format not in DOC_FORMATS:
        raise ConfigError(f"unknown doc_format {doc_format!r}: use one of {DOC_FORMATS}.")
    docs = example.documents
    if example.task == "kv":
        if parallel:
            return _join([f'"{d.title}": "{d.text}",\n' for d in docs], "", "{", "}")
        return _join([f'"{d.title}": "{d.text}"' for d in docs], ",\n ", "{", "}")
    if doc_format == "xml":
        items = [f"<document{'' if parallel else ' index=' + quoteattr(str(i + 1))} id={quoteattr(d.id)} "
                 f"title={quoteattr(d.title)}>{escape(d.text)}</document>" for i, d in enumerate(docs)]
    else:
        items = [f"Document {'' if parallel else f'[{i + 1}]'}(Title: {d.title}) {d.text}" for i, d in enumerate(docs)]
    return _join([item + "\n" for item in items], "") if parallel else _join(items, "\n")


def render_text(example: Example, variant: Variant = Variant(), allow_empty: bool = False):
    """The prompt text before chat wrapping, with character spans of the documents and the question.
    `allow_empty` renders a documents prompt with none (a budget's fixed part, or all dropped)."""
    if variant.condition not in CONDITIONS:
        raise ConfigError(f"unknown condition {variant.condition!r}: use one of {CONDITIONS}.")
    if not example.documents and variant.condition != "closedbook" and not allow_empty:
        raise DataError(f"example {example.id} has no documents.")
    if variant.condition == "oracle":
        example = Example(example.id, example.question, example.answers, (example.gold,), example.task)
    shown = () if variant.condition == "closedbook" else example.documents
    name = template_name(example.task, variant)
    docs_text, doc_spans = _format_documents(example, variant.doc_format, variant.parallel) if shown else ("", [])
    doc_field, q_field = ("formatted_kv_records", "key") if example.task == "kv" else ("search_results", "question")
    text, fields, inner = _fill(load_template(name, variant),
                                {doc_field: (docs_text, doc_spans), q_field: (example.question, [])})
    if shown and doc_field not in fields:
        raise ConfigError(f"template {name} has no {{{doc_field}}} field.")
    return text, shown, inner, fields.get(q_field, []), name


def _char_to_token_span(offsets, start: int, end: int) -> tuple[int, int]:
    first = next(i for i, (s, e) in enumerate(offsets) if e > start and e > s)
    last = max(i for i, (s, e) in enumerate(offsets) if s < end and e > s)
    return first, last + 1


def uses_chat(tokenizer, variant: Variant) -> bool:
    has = bool(getattr(tokenizer, "chat_template", None))
    if variant.chat and not has:
        raise ConfigError("chat=True but this tokenizer has no chat template; use chat=None or False.")
    return has if variant.chat is None else bool(variant.chat)


def render(example: Example, tokenizer, variant: Variant = Variant(), allow_empty: bool = False) -> Prompt:
    """Render, wrap in the chat template if any, tokenize, and locate every span in tokens."""
    text, shown, doc_chars, q_chars, name = render_text(example, variant, allow_empty)
    chat = uses_chat(tokenizer, variant)
    prefix, suffix = "", ""
    if chat:
        prefix, _, suffix = tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}], tokenize=False,
                                                          add_generation_prompt=True).partition(_SENTINEL)
    full, shift = prefix + text + suffix, len(prefix)
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError("prompt manifests need a fast tokenizer (offset mapping); load the model's fast one.")
    doc_chars = tuple((s + shift, e + shift) for s, e in doc_chars)
    parallel = variant.parallel and bool(shown)
    if parallel:  # each block alone, so a document's tokens do not depend on its neighbours
        cuts = [0] + [s for s, _ in doc_chars] + [doc_chars[-1][1], len(full)]
        ids, offsets, doc_spans = [], [], []
        for k, (a, b) in enumerate(zip(cuts, cuts[1:])):
            enc = tokenizer(full[a:b], add_special_tokens=not chat and k == 0, return_offsets_mapping=True)
            if 0 < k <= len(doc_chars):
                doc_spans.append((len(ids), len(ids) + len(enc["input_ids"])))
            ids += enc["input_ids"]
            offsets += [(s + a, e + a) if e > s else (s, e) for s, e in enc["offset_mapping"]]
        doc_spans = tuple(doc_spans)
    else:
        enc = tokenizer(full, add_special_tokens=not chat, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        doc_spans = tuple(_char_to_token_span(offsets, s, e) for s, e in doc_chars)
    manifest = Manifest(
        doc_ids=tuple(d.id for d in shown), doc_spans=doc_spans,
        doc_char_spans=doc_chars, gold_index=next((i for i, d in enumerate(shown) if d.is_gold), None),
        question_spans=tuple(_char_to_token_span(offsets, s + shift, e + shift) for s, e in q_chars),
        num_tokens=len(ids), sha256=hashlib.sha256(" ".join(map(str, ids)).encode()).hexdigest(),
        template=f"{'user' if variant.template_text is not None else variant.template}:{name}", chat=chat,
        doc_format=variant.doc_format, parallel=parallel)
    return Prompt(example.id, full, tuple(ids), manifest)
