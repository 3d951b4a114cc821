"""The README, docs/ and the notebooks' text: every relative link resolves (file and anchor), every docs page is
reachable from the README, and the licence and citation files are there and parse."""
from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    text = FENCE.sub("", text)
    found = {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}
    return found | set(re.findall(r'<a id="([^"]+)"', text))


def links(text: str) -> list[str]:
    return LINK.findall(CODE.sub("", FENCE.sub("", text)))


def broken_links(source: Path, text: str, root: Path = ROOT) -> list[str]:
    """The relative links in `text` (markdown read from `source`) whose file or anchor does not exist."""
    bad = []
    for target in links(text):
        if re.match(r"^[a-z]+:", target):  # http(s), mailto: not checked (no network in the tests)
            continue
        path, _, anchor = target.partition("#")
        if not path:
            if anchor not in anchors(text):
                bad.append(f"{source.relative_to(root)}: {target} (no such anchor)")
            continue
        dest = (source.parent / path).resolve()
        if not dest.exists():
            bad.append(f"{source.relative_to(root)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            bad.append(f"{source.relative_to(root)}: {target} (no such anchor)")
    return bad


def _documents() -> list[tuple[Path, str]]:
    docs = [ROOT / "README.md", ROOT / "lib" / "README.md", ROOT / "data" / "README.md",
            *sorted((ROOT / "docs").glob("*.md"))]
    out = [(p, p.read_text()) for p in docs]
    for nb in sorted((ROOT / "notebooks").glob("**/*.ipynb")):
        if nb.name.endswith((".running.ipynb", ".stopped.ipynb")):  # make paper's unfinished copies (links not rebased)
            continue
        cells = json.loads(nb.read_text())["cells"]
        out.append((nb, "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")))
    return out


def test_every_relative_link_resolves():
    bad = [b for source, text in _documents() for b in broken_links(source, text)]
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_the_link_check_finds_a_broken_file_and_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# A title, with punctuation!\n\n<a id=\"term\"></a>**Term.**\n")
    page = tmp_path / "b.md"
    text = ("[ok](a.md) [ok](a.md#a-title-with-punctuation) [ok](a.md#term) [self](#local) [web](https://x.org/y)\n"
            "## Local\n`[in code](missing.md)`\n```\n[in a fence](missing.md)\n```\n"
            "[gone](missing.md) [no anchor](a.md#nope) ![img](fig.png)\n")
    assert broken_links(page, text, tmp_path) == ["b.md: missing.md (no such file)", "b.md: a.md#nope (no such anchor)",
                                        "b.md: fig.png (no such file)"]


def test_every_docs_page_is_linked_from_the_readme():
    readme = {(ROOT / t.partition("#")[0]).resolve() for t in links((ROOT / "README.md").read_text())}
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in readme]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_the_licence_is_mit_and_the_citation_file_parses():
    licence = (ROOT / "LICENSE").read_text()
    assert licence.startswith("MIT License") and "Permission is hereby granted, free of charge" in licence
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0"
    for key in ("message", "title", "authors", "license"):
        assert cff[key], key
    assert cff["license"] == "MIT"
    for ref in cff["references"]:  # the fields CFF 1.2.0 requires of a reference, and a year for each paper
        assert ref["type"] and ref["title"] and ref["authors"] and int(ref["year"]), ref.get("title")
        assert all(a.get("family-names") or a.get("name") for a in ref["authors"]), ref["title"]
    liu = [r for r in cff["references"] if r["title"].startswith("Lost in the Middle")]
    assert len(liu) == 1 and liu[0]["doi"] == "10.1162/tacl_a_00638" and liu[0]["year"] == 2024


def test_the_readme_is_a_landing_page():
    """About 1,000 words of prose (code blocks and tables' cells count too, but not the table `make paper --readme`
    writes between its two markers: the issue asks the README to lead with it), and the two commands first."""
    text = (ROOT / "README.md").read_text()
    head, marker, rest = text.partition("<!-- paper-table -->")
    assert marker and "<!-- paper-table -->" in rest, "README.md needs the two paper-table markers"
    words = len((head + rest.partition("<!-- paper-table -->")[2]).split())
    assert words <= 1500, f"README.md has {words} words; move the depth into docs/"
    first_block = FENCE.search(text).group(0)
    assert "make reproduce" in first_block and "make test" in first_block
    assert "rewrites" in text and "figures/" in text
