"""Tests for litm.data.fetch against a local HTTP server (no internet needed)."""

from __future__ import annotations

import hashlib
import http.server
import random
import re
import socket
import threading
import urllib.parse

import pytest

from litm.data import fetch as fetch_mod
from litm.data.fetch import LIU2023_FILES, fetch_liu2023
from litm.errors import FetchError, LitmError

REL_A = "qa_data/nq-open-oracle.jsonl.gz"
REL_B = "kv_retrieval_data/kv-retrieval-75_keys.jsonl.gz"
REL_C = "src/lost_in_the_middle/prompts/qa.prompt"
SUBSET = [REL_A, REL_B, REL_C]

_rng = random.Random(2023)
CONTENT = {rel: _rng.randbytes(_rng.randint(3000, 6000)) for rel in SUBSET}


class FakeRepo:
    """A tiny HTTP server serving CONTENT under /raw/, with knobs for misbehaving."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.log: list[tuple[str, str | None]] = []  # (relpath, Range header)
        self.ignore_range = False  # answer 200 with the whole body even to Range
        self.lie_length = False  # announce more bytes than are sent
        self.cut_body = False  # send half of the body, then close the connection
        repo = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_GET(self):
                rel = urllib.parse.unquote(self.path.removeprefix("/raw/"))
                rng = self.headers.get("Range")
                repo.log.append((rel, rng))
                body = repo.files.get(rel)
                if body is None:
                    self.send_error(404)
                    return
                start = 0
                m = re.fullmatch(r"bytes=(\d+)-", rng or "")
                if m and not repo.ignore_range:
                    start = int(m.group(1))
                    if start >= len(body):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                payload = body[start:]
                announced = len(payload) + (100 if repo.lie_length else 0)
                self.send_header("Content-Length", str(announced))
                self.end_headers()
                if repo.cut_body:
                    payload = payload[: len(payload) // 2]
                self.wfile.write(payload)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/raw/"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def repo():
    r = FakeRepo(dict(CONTENT))
    yield r
    r.close()


def _fetch(repo, dest, files=SUBSET, **kw):
    return fetch_liu2023(dest, base_url=repo.url, files=files, timeout=5.0, progress=False, **kw)


def _sums(dest):
    lines = (dest / "SHA256SUMS").read_text().splitlines()
    return dict(reversed(line.split("  ", 1)) for line in lines), lines


def test_file_list_is_complete():
    """LIU2023_FILES has the 1+3+5+7 QA files, 3 KV files and 6 prompts, no duplicates."""
    assert len(LIU2023_FILES) == len(set(LIU2023_FILES)) == 1 + 15 + 3 + 6
    assert "qa_data/20_total_documents/nq-open-20_total_documents_gold_at_14.jsonl.gz" in LIU2023_FILES
    assert "kv_retrieval_data/kv-retrieval-300_keys.jsonl.gz" in LIU2023_FILES
    assert "src/lost_in_the_middle/prompts/closedbook_qa.prompt" in LIU2023_FILES


def test_fresh_download(repo, tmp_path):
    """Files land with the right bytes and SHA256SUMS lists their true sha256, sorted."""
    dest = tmp_path / "liu"
    paths = _fetch(repo, dest)
    assert paths == [dest / rel for rel in SUBSET]
    for rel in SUBSET:
        assert (dest / rel).read_bytes() == CONTENT[rel]
        assert not (dest / (rel + ".part")).exists()
    sums, lines = _sums(dest)
    assert sums == {rel: hashlib.sha256(CONTENT[rel]).hexdigest() for rel in SUBSET}
    assert lines == sorted(lines, key=lambda line: line.split("  ", 1)[1])


def test_resume_uses_range(repo, tmp_path):
    """An existing .part is continued with a Range request from its size."""
    dest = tmp_path / "liu"
    half = len(CONTENT[REL_A]) // 2
    (dest / "qa_data").mkdir(parents=True)
    (dest / (REL_A + ".part")).write_bytes(CONTENT[REL_A][:half])
    _fetch(repo, dest, files=[REL_A])
    assert (dest / REL_A).read_bytes() == CONTENT[REL_A]
    assert not (dest / (REL_A + ".part")).exists()
    assert repo.log == [(REL_A, f"bytes={half}-")]


def test_server_ignoring_range_restarts(repo, tmp_path):
    """A 200 answer to a Range request overwrites the .part instead of appending."""
    repo.ignore_range = True
    dest = tmp_path / "liu"
    (dest / "qa_data").mkdir(parents=True)
    (dest / (REL_A + ".part")).write_bytes(b"junk that is not the file's start")
    _fetch(repo, dest, files=[REL_A])
    assert (dest / REL_A).read_bytes() == CONTENT[REL_A]
    assert repo.log[0][1] is not None  # it did ask for a range


def test_second_call_makes_no_request(repo, tmp_path, capsys):
    """Verified files are skipped without touching the network."""
    dest = tmp_path / "liu"
    fetch_liu2023(dest, base_url=repo.url, files=SUBSET, timeout=5.0, progress=True)
    assert len(repo.log) == len(SUBSET)
    assert f"fetched {REL_A} ({len(CONTENT[REL_A])} bytes)" in capsys.readouterr().err
    fetch_liu2023(dest, base_url=repo.url, files=SUBSET, timeout=5.0, progress=True)
    assert len(repo.log) == len(SUBSET)
    assert f"already present {REL_A}" in capsys.readouterr().err


def test_existing_file_without_sum_is_recorded(repo, tmp_path):
    """A file placed by hand is recorded in SHA256SUMS, not downloaded."""
    dest = tmp_path / "liu"
    (dest / "src/lost_in_the_middle/prompts").mkdir(parents=True)
    (dest / REL_C).write_bytes(b"hand-made prompt")
    _fetch(repo, dest, files=[REL_C])
    assert repo.log == []
    assert _sums(dest)[0] == {REL_C: hashlib.sha256(b"hand-made prompt").hexdigest()}


def test_corrupted_file_raises(repo, tmp_path):
    """A file whose bytes changed after fetching fails verification, naming the file."""
    dest = tmp_path / "liu"
    _fetch(repo, dest)
    target = dest / REL_B
    data = bytearray(target.read_bytes())
    data[10] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(FetchError) as exc:
        _fetch(repo, dest)
    assert str(target) in str(exc.value)
    assert "Delete" in str(exc.value)
    assert isinstance(exc.value, LitmError)


@pytest.mark.parametrize("mode", ["cut_body", "lie_length"])
def test_short_body_keeps_part(repo, tmp_path, mode):
    """A body shorter than announced raises, leaves no final file, and keeps the .part."""
    setattr(repo, mode, True)
    dest = tmp_path / "liu"
    with pytest.raises(FetchError) as exc:
        _fetch(repo, dest, files=[REL_A])
    assert "resume" in str(exc.value)
    assert not (dest / REL_A).exists()
    part = dest / (REL_A + ".part")
    assert part.exists()
    kept = part.read_bytes()
    assert CONTENT[REL_A].startswith(kept)
    assert not (dest / "SHA256SUMS").exists()
    # once the server behaves, the next call resumes from the .part and completes
    setattr(repo, mode, False)
    n = len(repo.log)
    _fetch(repo, dest, files=[REL_A])
    assert (dest / REL_A).read_bytes() == CONTENT[REL_A]
    assert repo.log[n] == (REL_A, f"bytes={len(kept)}-")


def test_offline_raises_clear_error(tmp_path):
    """A port with nothing listening gives one FetchError saying offline/unreachable."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    dest = tmp_path / "liu"
    url = f"http://127.0.0.1:{port}/raw/"
    with pytest.raises(FetchError) as exc:
        fetch_liu2023(dest, base_url=url, files=SUBSET, timeout=2.0, progress=False)
    msg = str(exc.value)
    assert "offline" in msg and "unreachable" in msg
    assert url + REL_A in msg
    assert str(dest) in msg and "by hand" in msg
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_http_404_names_url(repo, tmp_path):
    """A missing file on the server raises FetchError naming the full URL."""
    missing = "qa_data/does-not-exist.jsonl.gz"
    with pytest.raises(FetchError) as exc:
        _fetch(repo, tmp_path / "liu", files=[missing])
    assert repo.url + missing in str(exc.value)
    assert "404" in str(exc.value)
    assert not (tmp_path / "liu" / missing).exists()


def test_env_var_sets_base_url(repo, tmp_path, monkeypatch):
    """LITM_LIU2023_URL is used when base_url is not given."""
    monkeypatch.setenv(fetch_mod.BASE_URL_ENV, repo.url)
    fetch_liu2023(tmp_path / "liu", files=[REL_C], timeout=5.0, progress=False)
    assert (tmp_path / "liu" / REL_C).read_bytes() == CONTENT[REL_C]
    assert repo.log == [(REL_C, None)]


def test_rejects_escaping_paths(tmp_path):
    """Paths leaving the destination folder are refused before any download."""
    with pytest.raises(FetchError):
        fetch_liu2023(tmp_path, base_url="http://127.0.0.1:9/", files=["../evil"], progress=False)
