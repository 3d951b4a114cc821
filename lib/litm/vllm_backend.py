"""An optional vLLM backend for greedy generation (`--backend vllm`), tensor-parallel across GPUs.

vLLM is imported only when this backend is asked for; it is an extra dependency (`pip install vllm`,
Linux with a CUDA GPU).  Prompts are rendered with the model's Hugging Face tokenizer exactly as for
the transformers backend and handed to vLLM as token ids, so both backends see the same tokens and
the manifests (where the gold sits) stay true.  Log-likelihood and forced choice stay on transformers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import ClassVar, Sequence

from .errors import ModelError
from .models import hub_revision, resolve
from .prompts import Prompt
from .runner import Scored

INSTALL = ("the vLLM backend needs the optional package vllm (Linux with a CUDA GPU): run `pip install vllm`, "
           "or use the default backend (--backend transformers).")


@dataclass
class VLLMModel:
    """A vLLM engine with the surface a sweep needs: tokenizer, name, identity, window."""

    llm: object
    tokenizer: object
    name: str
    window: int
    identity: dict = field(default_factory=dict)
    backend: ClassVar[str] = "vllm"

    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int = 100) -> list[Scored]:
        """Greedy decoding of every prompt in one call (vLLM schedules the batch), stopping at a newline,
        the end of turn or `max_new_tokens`; the same contract as `runner.generate`."""
        import vllm

        params = vllm.SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop=["\n"])
        t0 = time.perf_counter()
        outs = self.llm.generate([{"prompt_token_ids": list(p.input_ids)} for p in prompts], params, use_tqdm=False)
        dt = (time.perf_counter() - t0) / max(len(prompts), 1)
        if len(outs) != len(prompts):
            raise ModelError(f"vLLM returned {len(outs)} outputs for {len(prompts)} prompts.")
        return [Scored(prediction=o.outputs[0].text, latency_s=dt) for o in outs]


def load_vllm(name: str, tensor_parallel_size: int = 1, dtype: str | None = None,
              max_model_len: int | None = None, **engine_kwargs) -> VLLMModel:
    """Start a vLLM engine for a registry name, hub id, local directory or GGUF file (GGUF is dequantised
    to our safetensors cache first, as for transformers)."""
    try:
        import vllm
    except ImportError:
        raise ModelError(INSTALL) from None
    from transformers import AutoConfig, AutoTokenizer

    if tensor_parallel_size < 1:
        raise ModelError(f"tensor_parallel_size must be at least 1, got {tensor_parallel_size}.")
    source, identity = resolve(name)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    cfg = AutoConfig.from_pretrained(source)
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    window = int(max_model_len or getattr(cfg, "max_position_embeddings", 0) or tokenizer.model_max_length)
    llm = vllm.LLM(model=source, tokenizer=source, tensor_parallel_size=tensor_parallel_size,
                   dtype=dtype or "auto", max_model_len=window, seed=0, **engine_kwargs)
    if identity["kind"] == "hub":
        identity["weights"]["revision"] = hub_revision(name)
    identity.update({"backend": "vllm", "device": "cuda", "vllm_version": getattr(vllm, "__version__", "unknown"),
                     "tensor_parallel_size": tensor_parallel_size, "dtype": dtype or "auto"})
    return VLLMModel(llm, tokenizer, name, window, identity)
