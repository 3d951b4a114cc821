"""benchmarks/cpu_roofline.py counts a prefill's FLOPs as a hand count does, sliding windows included."""
import pytest

from conftest import benchmark_module


@pytest.fixture(scope="module")
def roofline():
    return benchmark_module("cpu_roofline")


def test_a_llama_prefill_counted_by_hand(roofline):
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=2, vocab_size=600)
    # per layer: q 64x64, k and v 64x32, o 64x64, gate and up 64x128, down 128x64
    per_token = 2 * 2 * (4096 + 2048 + 2048 + 4096 + 3 * 8192)
    causal = 100 * 101 // 2  # keys seen by 100 tokens
    attention = 2 * (2 * 2 * causal * 4 * 16)  # two layers; q.k and p.v; 4 heads of 16
    assert roofline.prefill_flops(cfg, 100) == per_token * 100 + attention + 2 * 64 * 600


def test_sliding_layers_count_only_their_window(roofline):
    from transformers import Gemma3TextConfig

    cfg = Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=1,
                           head_dim=16, num_hidden_layers=3, sliding_window=24, vocab_size=600,
                           layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    windowed = 24 * 25 // 2 + (100 - 24) * 24  # tokens 1..24 see themselves and all before; later ones 24 keys
    full = 100 * 101 // 2
    per_layer_projections = 2 * 100 * (64 * 64 + 2 * 64 * 16 + 64 * 64 + 3 * 64 * 128)
    expected = 3 * per_layer_projections + 4 * 4 * 16 * (2 * windowed + full) + 2 * 64 * 600
    assert roofline.prefill_flops(cfg, 100) == expected


def test_the_profile_split_puts_each_operator_in_its_part(roofline):
    rows = [("aten::mm", 50.0), ("aten::addmm", 10.0), ("aten::_scaled_dot_product_flash_attention_for_cpu", 25.0),
            ("aten::mul", 6.0), ("aten::_softmax", 4.0), ("aten::copy_", 3.0), ("aten::linear", 0.0),
            ("aten::mm", 2.0)]  # a name met twice (key_averages groups, a raw event list need not)
    assert roofline.split_profile(rows) == {"products": 62.0, "attention": 29.0, "rest": 9.0}
    assert roofline.split_profile([]) == {"products": 0.0, "attention": 0.0, "rest": 0.0}
