"""Append-only, resumable results: one JSONL file of records per run config, beside a manifest.

A record is written as one line and flushed to disk before the next example starts.  A run killed
mid-write leaves at most one truncated last line, which is dropped (and its example redone) on reopen.
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


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def read_records(path: Path) -> tuple[list[dict], int]:
    """The records of a records.jsonl (first one per example id) and the byte length of its complete
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
        records.setdefault(rec["example_id"], rec)
    return list(records.values()), end


class ResultStore:
    """Records of one run config, keyed by example id, in `<root>/<config hash>/records.jsonl`."""

    def __init__(self, root: str | Path, config_hash: str, config: dict, model_identity: dict | None = None):
        self.dir = Path(root) / config_hash
        self.path = self.dir / "records.jsonl"
        self.manifest_path = self.dir / "manifest.json"
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.manifest_path.is_file():
            old = json.loads(self.manifest_path.read_text(encoding="utf-8"))
            if old.get("config") != config:
                raise DataError(f"{self.manifest_path}: holds results of another config with the same hash; "
                                "move that folder away.")
        else:
            _atomic_write(self.manifest_path, json.dumps(
                {"config_hash": config_hash, "config": config, "model": model_identity or {},
                 "environment": environment()}, indent=2, sort_keys=True))
        self._records: dict[str, dict] = {}
        self._load()

    def _load(self) -> None:
        records, end = read_records(self.path)
        if self.path.exists() and end < self.path.stat().st_size:
            with open(self.path, "r+b") as fh:  # a write was cut short: drop it, its example is redone
                fh.truncate(end)
        self._records = {r["example_id"]: r for r in records}

    def __contains__(self, example_id: str) -> bool:
        return example_id in self._records

    def __len__(self) -> int:
        return len(self._records)

    def append(self, record: dict) -> None:
        """Write one record and force it to disk; an example already stored is never written twice."""
        if record["example_id"] in self._records:
            return
        line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
        with open(self.path, "ab") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        self._records[record["example_id"]] = record

    def records(self, example_ids=None) -> list[dict]:
        if example_ids is None:
            return list(self._records.values())
        return [self._records[i] for i in example_ids if i in self._records]


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
        store = ResultStore(dest, config_hash, manifests[0]["config"], manifests[0].get("model"))
        for f in folders:
            if f.resolve() == store.dir.resolve():
                continue
            for rec in read_records(f / "records.jsonl")[0]:
                store.append(rec)  # an example already there is kept once
        out[config_hash] = len(store)
    return out
