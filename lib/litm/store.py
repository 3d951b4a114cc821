"""Append-only, resumable, locked results: one JSONL file of records per run config, beside a manifest.

A record is written as one line and flushed to disk before the next example starts.  A run killed mid-write
leaves at most one truncated last line, which is dropped (and its example redone) on reopen, with a note.
One process at a time writes a run folder: a store holds an exclusive lock on `<run folder>/.lock` (which
names its process) while it is open, and a second writer stops with an error naming the first.  The kernel
releases the lock of a killed process, so a lock never outlives its writer.  A store that writes nothing
leaves no folder behind.
"""
from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from .errors import DataError, LitmError, LockedError

_PACKAGES = ("litm", "torch", "transformers", "tokenizers", "datasets", "numpy", "pandas")
CONDITION = ("condition", "position")  # a sweep's condition fields; what a manifest without a "condition" names

try:
    import fcntl

    def _try_lock(fd: int) -> bool:
        """Take the exclusive lock on an open file without waiting; False when another process holds it."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
except ImportError:  # Windows (not tested here): a lock on the file's first byte
    import msvcrt

    def _try_lock(fd: int) -> bool:
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except PermissionError:
            return False
        return True


def environment() -> dict:
    """Package versions, Python, platform and the git commit of the working tree (when there is one)."""
    versions = {}
    for pkg in _PACKAGES:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"packages": versions, "python": platform.python_version(), "platform": platform.platform(),
            "git_commit": commit}


def read_manifest(folder: Path) -> dict:
    """A run folder's manifest.json; a truncated or foreign one is a DataError naming it."""
    path = Path(folder) / "manifest.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not a readable manifest ({exc.__class__.__name__}: {exc}); it was cut short or "
                        "edited. Restore it from a copy, or move the folder away to redo its run.") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict):
        raise DataError(f"{path}: has no run config; it is not a litm manifest. Move the folder away.")
    return manifest


def read_records(path: Path, key: str = "example_id", note: bool = False) -> tuple[list[dict], int]:
    """The records of a records.jsonl (the first one per `key`) and the byte length of its complete
    lines; a last line cut short by a kill is left out (said on stderr when `note`).  A complete line that
    is not a record of the run (not JSON, not an object, no `key`) is a DataError naming file and line."""
    path = Path(path)
    if not path.exists():
        return [], 0
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    records: dict[str, dict] = {}
    for lineno, line in enumerate(data[:end].splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise DataError(f"{path}:{lineno}: corrupt record (not JSON). Delete that line or the "
                            "folder to redo those examples.") from None
        if not isinstance(rec, dict) or not isinstance(rec.get(key), str):
            raise DataError(f"{path}:{lineno}: not a record of this run (no {key!r}). Delete that line or the "
                            "folder to redo those examples.")
        records.setdefault(rec[key], rec)
    if note and end < len(data):
        print(f"note: {path}: dropped a half-written last line (a run was stopped mid-write); its example is "
              "scored again.", file=sys.stderr)
    return list(records.values()), end


def _holder(lock_path: Path) -> str:
    try:
        info = json.loads(lock_path.read_text(encoding="utf-8"))
        return f"process {info['pid']} on {info['host']} (since {info['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


class ResultStore:
    """Records of one run config in `<root>/<config hash>/records.jsonl`, one per `key` (an example id, or
    a trial id where one example gives several prompts).  The manifest also names the run config's
    `condition` fields: what its runs of one study do not share.  Opening a store takes the folder's lock
    (LockedError when another process holds it); `close()` (or a `with` block) gives it back."""

    def __init__(self, root: str | Path, config_hash: str, config: dict, model_identity: dict | None = None,
                 key: str = "example_id", condition: tuple[str, ...] = CONDITION,
                 extra: dict | None = None):
        self.key = key
        self.dir = Path(root) / config_hash
        self.path = self.dir / "records.jsonl"
        self.manifest_path = self.dir / "manifest.json"
        self._made = [p for p in (*reversed(self.dir.parents), self.dir) if not p.exists()]
        self._lock = None
        self._lock_folder()
        try:
            if self.manifest_path.is_file() and read_manifest(self.dir)["config"] != config:
                raise DataError(f"{self.manifest_path}: holds results of another config with the same hash; "
                                "move that folder away.")
            self._manifest = {"config_hash": config_hash, "config": config, "model": model_identity or {},
                              "key": key, "condition": list(condition)}
            self._extra = extra or {}  # fields the first record's manifest takes as given (shard; a merge's sources)
            records, end = read_records(self.path, key, note=True)
            if self.path.exists() and end < self.path.stat().st_size:
                with open(self.path, "r+b") as fh:  # a write was cut short: drop it, its example is redone
                    fh.truncate(end)
        except BaseException:
            self.close()
            raise
        self._records: dict[str, dict] = {r[key]: r for r in records}

    def _lock_folder(self) -> None:
        lock_path = self.dir / ".lock"
        for _ in range(20):  # the folder or its lock file may be removed under us by a writer that wrote nothing
            self.dir.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
            except FileNotFoundError:
                continue
            if not _try_lock(fd):
                os.close(fd)
                raise LockedError(f"{self.dir} is being written by {_holder(lock_path)}. Wait for it to finish "
                                  "(then run again to add what is missing), or give another results folder.")
            try:
                same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
            except FileNotFoundError:
                same = False
            if same:  # we hold the lock of the file that is there now
                os.ftruncate(fd, 0)
                os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                         "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
                self._lock = fd
                return
            os.close(fd)
        raise LockedError(f"{self.dir}: could not take its lock; another process keeps removing it.")

    def close(self) -> None:
        """Give the lock back; a store that wrote nothing removes the folders it made."""
        if self._lock is None:
            return
        if not self.manifest_path.exists() and not self.path.exists():
            for p in [self.dir / ".lock", *reversed(self._made)]:
                try:
                    p.unlink() if p.name == ".lock" else p.rmdir()
                except OSError:
                    break
        os.close(self._lock)
        self._lock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_lock", None) is not None:
            os.close(self._lock)

    def __contains__(self, key: str) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)

    def write_manifest(self, extra: dict) -> None:
        """Write the manifest whole (a temporary file renamed over it) with `extra` fields."""
        tmp = self.manifest_path.with_name(self.manifest_path.name + ".tmp")
        tmp.write_text(json.dumps({**self._manifest, **extra}, indent=2, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.manifest_path)

    def append(self, record: dict, first_prompt: dict | None = None) -> None:
        """Write one record and force it to disk; an example already stored is never written twice.  The first
        record writes the manifest, with `first_prompt` (what its prompt was: `study.logged_prompt`)."""
        if self._lock is None:
            raise LitmError(f"{self.dir}: the store was closed; open it again to add records.")
        if record[self.key] in self._records:
            return
        if not self.manifest_path.is_file():
            logged = {"first_prompt": first_prompt} if first_prompt is not None else {}
            self.write_manifest({**logged, "environment": environment(), **self._extra})
        line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
        with open(self.path, "ab") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        self._records[record[self.key]] = record

    def records(self, keys=None) -> list[dict]:
        return list(self._records.values()) if keys is None else [self._records[i] for i in keys if i in self._records]


def study_config(manifest: dict) -> dict:
    """A run's config without its condition fields: what the runs of one study share."""
    return {k: v for k, v in manifest["config"].items() if k not in manifest.get("condition", CONDITION)}


def _sources(manifest: dict, folder: Path) -> list[dict]:
    """Where a run folder's records were scored: the folder itself, or (merged) each of its sources."""
    if manifest.get("sources"):
        return manifest["sources"]
    return [{"folder": str(folder), "shard": manifest.get("shard"), "environment": manifest.get("environment"),
             "first_prompt": manifest.get("first_prompt")}]


def merge(sources, dest: str | Path) -> dict[str, int]:
    """Merge the run folders of the jobs of one sharded study (each with manifest.json and records.jsonl,
    found under `sources`) into `dest`: one folder per config hash, one record per example.  Every run must
    belong to the same study (the same config but for its condition); runs that differ in anything else are
    refused, with the fields named.  The merged manifest keeps each source's shard, environment and first
    prompt under `sources` (its own `environment` and `first_prompt` are the first source's).  Returns how
    many records each hash has in `dest` afterwards."""
    runs: dict[str, list[tuple[Path, dict]]] = {}
    for src in sources:
        for manifest in sorted(Path(src).rglob("manifest.json")):
            runs.setdefault(manifest.parent.name, []).append((manifest.parent, read_manifest(manifest.parent)))
    if not runs:
        raise DataError(f"no run folders (manifest.json) under {list(map(str, sources))}.")
    studies = {json.dumps(study_config(m), sort_keys=True): f for folders in runs.values() for f, m in folders}
    if len(studies) > 1:
        (a, fa), (b, fb) = list(studies.items())[:2]
        a, b = json.loads(a), json.loads(b)
        diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        raise DataError(f"{fa} and {fb} are runs of different studies (they differ in "
                        + ", ".join(f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in diff)
                        + "); merge the shards of one study at a time.")
    shards = {tuple(s["shard"]) for fs in runs.values() for f, m in fs for s in _sources(m, f) if s.get("shard")}
    counts = {n for _, n in shards}
    if len(counts) > 1:
        raise DataError(f"the sources are shards of different splits ({sorted(counts)} jobs); merge one split.")
    if counts and len(shards) < next(iter(counts)):
        n = next(iter(counts))
        print(f"note: shards {sorted(set(range(n)) - {i for i, _ in shards})} of 0..{n - 1} are not among the "
              "sources; their examples are missing from the merge.", file=sys.stderr)
    out = {}
    for config_hash, folders in runs.items():
        m = folders[0][1]
        first = {k: m[k] for k in ("first_prompt", "environment") if k in m}
        with ResultStore(dest, config_hash, m["config"], m.get("model"), m.get("key", "example_id"),
                         tuple(m.get("condition", CONDITION)), extra=first) as store:
            old = read_manifest(store.dir) if store.manifest_path.is_file() else {}
            merged = [] if not old else _sources(old, store.dir)
            for f, fm in folders:
                if f.resolve() == store.dir.resolve():
                    continue
                merged += [s for s in _sources(fm, f) if s not in merged]
                for rec in read_records(f / "records.jsonl", store.key)[0]:
                    store.append(rec)  # an example already there is kept once
            if len(store):
                kept = {k: old[k] for k in ("first_prompt", "environment") if k in old} or first
                store.write_manifest({**kept, "sources": merged})
            out[config_hash] = len(store)
    return out
