"""benchmarks/candidate_pass.py's split attention equals attention written out in float64 (so its timing compares
like with like)."""
import torch

from conftest import benchmark_module


def test_split_attention_is_attention_over_every_key():
    bench = benchmark_module("candidate_pass")
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g) for n in (5, 12, 12))
    prompt = 7  # keys 0-6 the prompt's, 7-11 the candidates' (queries see some of them only)
    allowed = torch.ones(5, 12, dtype=torch.bool)
    allowed[:, prompt:] = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0],
                                        [0, 0, 1, 1, 1]], dtype=torch.bool)
    mask = torch.zeros(5, 12).masked_fill_(~allowed, float("-inf"))[None, None]
    scores = (q.double() @ k.double().transpose(-1, -2)) / 8 ** 0.5
    expected = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v.double()
    got = bench.split_attention(q, k, v, prompt, mask)
    assert torch.allclose(got.double(), expected, atol=1e-5)
    shifted = bench.split_attention(q, k, v, prompt + 2, mask)  # two masked keys taken as the prompt's: wrong
    assert not torch.allclose(shifted.double(), expected, atol=1e-3)
