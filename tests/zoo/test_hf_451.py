"""benchmarks/zoo/hf_451.py: the installed transformers allocates as xMem's 4.51.3 did inside
`transformers_451`, computes the same numbers, and is back to itself afterwards."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from peakmem.baselines.peakmem_estimator import XMEM_JOB

ZOO = Path(__file__).resolve().parents[2] / "benchmarks" / "zoo"
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="needs transformers"
)


@pytest.fixture(scope="module")
def hf_451():
    from peakmem.capture.vision_ops import declare_torchvision_ops

    declare_torchvision_ops()
    sys.path.insert(0, str(ZOO))
    try:
        import hf_451

        if hf_451.installed_is_xmem_transformers():
            pytest.skip("transformers 4.51.3 itself is installed: nothing to reproduce")
        yield hf_451
    finally:
        sys.path.remove(str(ZOO))


def _tiny(model_type: str, **values):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **values)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


TINY_GPT2 = dict(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=48)
TINY_OPT = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, ffn_dim=64,
                vocab_size=64, max_position_embeddings=48, word_embed_proj_dim=32)


def test_cache_keeps_the_first_states_and_is_restored(hf_451):
    import torch
    from transformers import DynamicCache

    keys, values = torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16)
    with hf_451.transformers_451(_tiny("gpt2", **TINY_GPT2)) as applied:
        assert "cache_keeps_first_states" in applied
        cache = DynamicCache()
        stored_keys, stored_values = cache.update(keys, values, 0)
        assert stored_keys is keys and stored_values is values  # 4.51: appended as they are
        more_keys, _ = cache.update(keys, values, 0)  # later states are concatenated
        assert more_keys.shape[-2] == 16 and more_keys.data_ptr() != keys.data_ptr()
    stored_keys, _ = DynamicCache().update(keys, values, 0)
    assert stored_keys is not keys and torch.equal(stored_keys, keys)  # 5.x copies again


def test_sdpa_function_only_for_models_that_used_the_integration(hf_451):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    installed = ALL_ATTENTION_FUNCTIONS["sdpa"]
    assert installed is not hf_451.sdpa_attention_forward_451
    with hf_451.transformers_451(_tiny("gpt2", **TINY_GPT2)):
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is hf_451.sdpa_attention_forward_451
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is installed
    # 4.51.3's OPT had its own OPTSdpaAttention (SDPA on the strided views)
    with hf_451.transformers_451(_tiny("opt", **TINY_OPT)):
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is installed


@pytest.mark.parametrize("model_type, values", [("gpt2", TINY_GPT2), ("opt", TINY_OPT)])
def test_same_numbers_with_the_451_behaviours(hf_451, model_type, values):
    """Only what is allocated changes: the logits, the loss and the cache's contents match."""
    import torch

    model = _tiny(model_type, **values)
    ids = torch.randint(0, 64, (2, 12))
    batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
    with torch.no_grad():
        plain = model(**batch)
        with hf_451.transformers_451(model):
            old = model(**batch)
    torch.testing.assert_close(old.logits, plain.logits)
    torch.testing.assert_close(old.loss, plain.loss)
    torch.testing.assert_close(old.past_key_values.layers[0].keys, plain.past_key_values.layers[0].keys)


def test_grouped_heads_are_repeated_as_451_did(hf_451):
    """4.51.3 repeat_kv + contiguous: the same attention as SDPA's own grouped-query path."""
    import torch

    module = torch.nn.Module()
    module.num_key_value_groups = 2
    query = torch.randn(1, 4, 6, 8)
    key, value = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    out, _ = hf_451.sdpa_attention_forward_451(module, query, key, value, None, scaling=0.5)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, is_causal=True, scale=0.5, enable_gqa=True)
    torch.testing.assert_close(out, expected.transpose(1, 2))
    repeated = hf_451.repeat_kv(key, 2)
    assert repeated.shape == (1, 4, 6, 8) and torch.equal(repeated[:, 1], key[:, 0])


def test_gpt2_gets_its_bias_buffers_back(hf_451):
    gpt2 = _tiny("gpt2", **TINY_GPT2)
    with hf_451.transformers_451(gpt2):
        attentions = [m for m in gpt2.modules() if type(m).__name__ == "GPT2Attention"]
        assert len(attentions) == 2
        for attention in attentions:
            assert attention.bias.shape == (1, 1, 48, 48) and attention.bias.dtype.is_floating_point is False
            assert int(attention.bias.sum()) == 48 * 49 // 2  # the lower triangle
    opt = _tiny("opt", **TINY_OPT)
    with hf_451.transformers_451(opt):
        assert not any(hasattr(m, "bias") and m.bias is not None
                       and getattr(m.bias, "ndim", 0) == 4 for m in opt.modules())


def _events(argv: list[str]):
    from peakmem.estimate.api import estimate_command
    from peakmem.trace.events import ALLOC_KINDS

    est = estimate_command(argv, gpu="rtx3060-12gb", torch_version="2.6.0")
    trace = est.capture.trace
    ops = []
    for i in range(len(trace)):
        if trace.kinds[i] in ALLOC_KINDS:
            tag = trace.tag_of(i)
            ops.append((tag.op if tag else None, tag.phase if tag else None, trace.sizes[i]))
    return est, ops


def test_the_job_traces_451s_allocations():
    """distilgpt2 (6 layers), one sequence of 16 tokens, one step: under 4.51.3 the cache adds no
    copies of the keys and values (5.x: one `cat` each per layer), SDPA gets contiguous copies of
    query, key and value (3 `clone`s per layer), and each layer holds a 1024 x 1024 bool mask."""
    base = ["python", str(XMEM_JOB), "--model", "distilgpt2", "--batch-size", "1",
            "--seq-len", "16", "--steps", "1"]
    installed, installed_ops = _events([*base, "--transformers", "installed"])
    old, old_ops = _events(base)
    head_bytes = 16 * 768 * 4  # one sequence's keys (or values, or queries) of one layer

    def count(ops, name):
        return sum(1 for op, phase, size in ops
                   if op == name and phase == "forward" and size == head_bytes)

    assert count(installed_ops, "cat.default") == 2 * 6
    assert count(old_ops, "cat.default") == 0
    assert count(old_ops, "clone.default") == count(installed_ops, "clone.default") + 3 * 6
    masks = [size for op, _phase, size in old_ops if size == 1024 * 1024]
    assert len(masks) >= 6
    assert old.peak_allocated_bytes > installed.peak_allocated_bytes


def test_sdpa_models_trace_no_mask_for_an_all_ones_batch():
    """On the GPU an SDPA model reads xMem's all-ones attention mask and drops it (4.51.3's
    `_ignore_causal_mask_sdpa`, 5.x's `sdpa_mask`); a capture reads zeros and would build a
    float mask per layer (`where`, 1 x 1 x 24 x 24 float32 for one sequence of 24 tokens)."""
    base = ["python", str(XMEM_JOB), "--model", "distilgpt2", "--batch-size", "1",
            "--seq-len", "24", "--steps", "1"]
    _, as_on_gpu = _events(base)
    _, passed = _events([*base, "--all-ones-mask", "pass"])

    def masks(ops):
        return sum(1 for op, phase, size in ops
                   if op == "where.self" and phase == "forward" and size == 24 * 24 * 4)

    assert masks(passed) >= 6  # one per layer
    assert masks(as_on_gpu) == 0
