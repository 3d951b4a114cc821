"""Append-only, resumable results: one JSONL file of records per run config, beside a manifest.

A run folder appears with its first record.  A record is written as one line and flushed to disk before
the next example starts.  A run killed mid-write leaves at most one truncated last line, which is dropped
(and its example redone) on reopen.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from .errors import DataError

_PACKAGES = ("litm", "torch", "transformers", "tokenizers", "datasets", "numpy", "pandas")


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


def read_records(path: Path, key: str = "example_id") -> tuple[list[dict], int]:
    """The records of a records.jsonl (the first one per `key`) and the byte length of its complete
    lines; a last line cut short by a kill is left out.  A corrupt complete line is a DataError."""
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
        except json.JSONDecodeError:
            raise DataError(f"{path}:{lineno}: corrupt record (not JSON). Delete that line or the "
                            "folder to redo those examples.") from None
        records.setdefault(rec[key], rec)
    return list(records.values()), end


class ResultStore:
    """Records of one run config in `<root>/<config hash>/records.jsonl`, one per `key` (an example id, or
    a trial id where one example gives several prompts).  The manifest also names the run config's
    `condition` fields: what its runs of one study do not share."""

    def __init__(self, root: str | Path, config_hash: str, config: dict, model_identity: dict | None = None,
                 key: str = "example_id", condition: tuple[str, ...] = ("condition", "position")):
        self.key = key
        self.dir = Path(root) / config_hash
        self.path = self.dir / "records.jsonl"
        self.manifest_path = self.dir / "manifest.json"
        if self.manifest_path.is_file():
            old = json.loads(self.manifest_path.read_text(encoding="utf-8"))
            if old.get("config") != config:
                raise DataError(f"{self.manifest_path}: holds results of another config with the same hash; "
                                "move that folder away.")
        self._manifest = {"config_hash": config_hash, "config": config, "model": model_identity or {}, "key": key,
                          "condition": list(condition)}
        records, end = read_records(self.path, key)
        if self.path.exists() and end < self.path.stat().st_size:
            with open(self.path, "r+b") as fh:  # a write was cut short: drop it, its example is redone
                fh.truncate(end)
        self._records: dict[str, dict] = {r[key]: r for r in records}

    def __contains__(self, key: str) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)

    def append(self, record: dict, first_prompt: dict | None = None) -> None:
        """Write one record and force it to disk; an example already stored is never written twice.  The first
        record writes the manifest, with `first_prompt` (what its prompt was: `study.logged_prompt`)."""
        if record[self.key] in self._records:
            return
        if not self.manifest_path.is_file():  # the folder appears with its first record
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.manifest_path.with_name(self.manifest_path.name + ".tmp")  # written whole, then renamed
            extra = {"first_prompt": first_prompt} if first_prompt is not None else {}
            tmp.write_text(json.dumps({**self._manifest, **extra, "environment": environment()}, indent=2,
                                      sort_keys=True), encoding="utf-8")
            os.replace(tmp, self.manifest_path)
        line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
        with open(self.path, "ab") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        self._records[record[self.key]] = record

    def records(self, keys=None) -> list[dict]:
        return list(self._records.values()) if keys is None else [self._records[i] for i in keys if i in self._records]


def merge(sources, dest: str | Path) -> dict[str, int]:
    """Merge run folders (each with manifest.json and records.jsonl, found under `sources`) into `dest`:
    one folder per config hash, one record per example.  Runs of one hash must hold the same config.
    Returns how many records each hash has in `dest` afterwards."""
    runs: dict[str, list[Path]] = {}
    for src in sources:
        for manifest in sorted(Path(src).rglob("manifest.json")):
            runs.setdefault(manifest.parent.name, []).append(manifest.parent)
    if not runs:
        raise DataError(f"no run folders (manifest.json) under {list(map(str, sources))}.")
    out = {}
    for config_hash, folders in runs.items():
        manifests = [json.loads((f / "manifest.json").read_text(encoding="utf-8")) for f in folders]
        if any(m["config"] != manifests[0]["config"] for m in manifests):
            raise DataError(f"run folders {[str(f) for f in folders]} share the hash {config_hash} but not the config; "
                            "merge runs of one experiment only.")
        m = manifests[0]
        store = ResultStore(dest, config_hash, m["config"], m.get("model"), m.get("key", "example_id"),
                            tuple(m.get("condition", ("condition", "position"))))
        for f in folders:
            if f.resolve() == store.dir.resolve():
                continue
            for rec in read_records(f / "records.jsonl", store.key)[0]:
                store.append(rec)  # an example already there is kept once
        out[config_hash] = len(store)
    return out
