"""Download the public data and prompt templates of Liu et al. 2023 ("Lost in the Middle").

The files come from the GitHub repository nelson-liu/lost-in-the-middle (branch main) and are stored under a
destination folder with the repository's relative paths. Downloads are resumable (``<file>.part`` plus an HTTP
Range request), checked against the announced length, and only then renamed to their final name. Every verified
file is recorded in ``<dest>/SHA256SUMS`` (the format of ``sha256sum``), and later calls check existing files
against it instead of downloading them again.

Only the standard library is used.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import pathlib
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable

from litm.errors import FetchError

REPO_PAGE = "https://github.com/nelson-liu/lost-in-the-middle"
DEFAULT_BASE_URL = "https://github.com/nelson-liu/lost-in-the-middle/raw/main/"
BASE_URL_ENV = "LITM_LIU2023_URL"
SUMS_NAME = "SHA256SUMS"

_GOLD_POSITIONS = {10: (0, 4, 9), 20: (0, 4, 9, 14, 19), 30: (0, 4, 9, 14, 19, 24, 29)}
_PROMPTS = ("qa", "qa_ordered_randomly", "qa_with_query_aware_contextualization", "closedbook_qa", "kv_retrieval",
            "kv_retrieval_with_query_aware_contextualization")

LIU2023_FILES: tuple[str, ...] = (
    ("qa_data/nq-open-oracle.jsonl.gz",)
    + tuple(f"qa_data/{n}_total_documents/nq-open-{n}_total_documents_gold_at_{k}.jsonl.gz"
            for n, ks in _GOLD_POSITIONS.items() for k in ks)
    + tuple(f"kv_retrieval_data/kv-retrieval-{n}_keys.jsonl.gz" for n in (75, 140, 300))
    + tuple(f"src/lost_in_the_middle/prompts/{name}.prompt" for name in _PROMPTS))

_CHUNK = 1 << 16
_USER_AGENT = "litm-fetch/1 (python urllib)"
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)
_SUM_LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)$")


def fetch_liu2023(dest: str | os.PathLike[str] = "data/liu2023", base_url: str | None = None,
                  files: Iterable[str] | None = None, timeout: float = 30.0,
                  progress: bool = True) -> list[pathlib.Path]:
    """Make sure ``files`` (default: all of ``LIU2023_FILES``) exist and verify under ``dest``.

    ``base_url`` defaults to ``$LITM_LIU2023_URL`` or else the GitHub repository. Returns the local paths in the
    order of ``files``. Raises ``FetchError`` for any network problem, a length mismatch, or an existing file whose
    sha256 differs from the one recorded in ``dest/SHA256SUMS``.
    """
    dest_dir = pathlib.Path(dest)
    base = base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL
    if not base.endswith("/"):
        base += "/"
    rels = [_check_relpath(r) for r in (LIU2023_FILES if files is None else files)]
    sums = _read_sums(dest_dir)
    paths: list[pathlib.Path] = []
    for rel in rels:
        final = dest_dir / rel
        if final.exists():
            digest, size = _hash_file(final)
            recorded = sums.get(rel)
            if recorded is not None and recorded.lower() != digest:
                raise FetchError(f"{final} does not match its sha256 recorded in {dest_dir / SUMS_NAME} (recorded "
                                 f"{recorded}, found {digest}); the file is corrupt or was changed. Delete {final} "
                                 "and fetch again.")
            note = f"already present {rel}" + ("" if recorded is not None else f" ({size} bytes, checksum recorded)")
        else:
            size = _download(base + urllib.parse.quote(rel, safe="/"), final, dest_dir, timeout)
            digest, recorded = _hash_file(final)[0], None
            note = f"fetched {rel} ({size} bytes)"
        if recorded is None:  # newly fetched, or present but not yet recorded
            sums[rel] = digest
            _write_sums(dest_dir, sums)
        if progress:
            print(note, file=sys.stderr, flush=True)
        paths.append(final)
    return paths


def _check_relpath(rel: str) -> str:
    """Refuse paths that would escape the destination folder."""
    p = pathlib.PurePosixPath(rel)
    if not rel or p.is_absolute() or ".." in p.parts or "\\" in rel:
        raise FetchError(f"bad file name {rel!r}: give paths relative to the repository root, "
                         f"like {LIU2023_FILES[0]!r}.")
    return p.as_posix()


def _hash_file(path: pathlib.Path) -> tuple[str, int]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def _read_sums(dest_dir: pathlib.Path) -> dict[str, str]:
    path = dest_dir / SUMS_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    sums: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            if (m := _SUM_LINE.match(line)) is None:
                raise FetchError(f"{path} line {n} is not '<sha256>  <path>': {line!r}. "
                                 f"Fix or delete {path}; it is rebuilt from the files present.")
            sums[m.group(2)] = m.group(1).lower()
    return sums


def _write_sums(dest_dir: pathlib.Path, sums: dict[str, str]) -> None:
    """Rewrite SHA256SUMS atomically, sorted by path."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = dest_dir / (SUMS_NAME + ".tmp")
    tmp.write_text("".join(f"{sums[r]}  {r}\n" for r in sorted(sums)), encoding="utf-8")
    os.replace(tmp, dest_dir / SUMS_NAME)


def _by_hand(dest_dir: pathlib.Path) -> str:
    return (f"Otherwise download the files by hand from {REPO_PAGE} (branch main) into {dest_dir}/, keeping their "
            f"paths inside the repository (e.g. {dest_dir / LIU2023_FILES[0]}), then run again; or point "
            f"{BASE_URL_ENV} at a mirror.")


def _open(url: str, offset: int, timeout: float, dest_dir: pathlib.Path):
    """Send the GET (with Range when resuming); map every failure to FetchError."""
    req = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    if offset > 0:
        req.add_header("Range", f"bytes={offset}-")
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code == 416 and offset > 0:
            return None  # our .part does not fit the file: caller restarts from zero
        raise FetchError(f"{url} answered HTTP {e.code} {e.reason}. Check the base URL (argument base_url or "
                         f"${BASE_URL_ENV}). {_by_hand(dest_dir)}") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
        reason = getattr(e, "reason", None) or e
        raise FetchError(f"could not download {url} ({reason}): this machine seems offline or the host is "
                         f"unreachable. {_by_hand(dest_dir)}") from None
    except ValueError as e:
        raise FetchError(f"cannot open {url} ({e}); check the base URL (argument base_url or "
                         f"${BASE_URL_ENV}).") from None


def _download(url: str, final: pathlib.Path, dest_dir: pathlib.Path, timeout: float) -> int:
    """Fetch ``url`` into ``final`` via ``final.part``; return the size in bytes."""
    part = final.with_name(final.name + ".part")
    offset = part.stat().st_size if part.exists() else 0
    resp = _open(url, offset, timeout, dest_dir)
    if resp is None:  # 416: throw the .part away and start over once
        part.unlink()
        offset = 0
        resp = _open(url, 0, timeout, dest_dir)

    with resp:
        if getattr(resp, "status", None) == 206:
            m = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
            if m is None or int(m.group(1)) != offset:
                raise FetchError(f"{url} answered a Range request with an unusable Content-Range "
                                 f"({resp.headers.get('Content-Range')!r}). Delete {part} and fetch again.")
            expected = None if m.group(3) == "*" else int(m.group(3))
            mode = "ab"
        else:
            length = resp.headers.get("Content-Length")
            expected = int(length) if length and length.strip().isdigit() else None
            offset = 0  # a plain 200 is the whole file: restart from zero
            mode = "wb"
        part.parent.mkdir(parents=True, exist_ok=True)
        got = offset
        with open(part, mode) as out:
            while True:
                try:
                    chunk = resp.read(_CHUNK)
                except (http.client.HTTPException, OSError) as e:
                    raise FetchError(f"download of {url} broke off after {got} bytes ({e!r}); the machine may be "
                                     f"offline or the host unreachable. The partial file {part} is kept: run again "
                                     f"to resume. {_by_hand(dest_dir)}") from None
                if not chunk:
                    break
                out.write(chunk)
                got += len(chunk)

    size = part.stat().st_size
    if expected is not None and size != expected:
        hint = (f"The partial file {part} is kept: run again to resume." if size < expected
                else f"Delete {part} and fetch again.")
        raise FetchError(f"{url}: got {size} bytes but the server announced {expected}. {hint}")
    os.replace(part, final)
    return size
