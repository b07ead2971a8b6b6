"""transformers behaviours of an older target release (capture/hf_release.py): with
PEAKMEM_TRANSFORMERS_RELEASE=5.17.0 a T5 passes its position bias to SDPA in the permuted layout
5.17 did, so its self-attention layers take CUDA's math path as on the H200 runs of
benchmarks/groundtruth/h200.csv; unset, the installed release's contiguous mask runs
memory-efficient attention."""

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.capture.hf_release import (
    RELEASE_VARIABLE,
    parse_release,
    position_bias_mask_as_is,
    runs_older_than,
)
from peakmem.cuda_rules import sdpa
from peakmem.profiles import load_gpu, load_stack

transformers = pytest.importorskip("transformers")
sdpa_attention = pytest.importorskip("transformers.integrations.sdpa_attention")


def test_release_numbers():
    assert parse_release("5.17.0") == (5, 17, 0)
    assert parse_release("5.20.0.dev0") == (5, 20, 0)
    assert parse_release("4.51.3rc1") == (4, 51, 3)
    with pytest.raises(ValueError):
        parse_release("main")


def test_only_a_named_older_release_changes_anything(monkeypatch):
    monkeypatch.delenv(RELEASE_VARIABLE, raising=False)
    assert not runs_older_than((5, 20))
    monkeypatch.setenv(RELEASE_VARIABLE, "5.17.0")
    assert runs_older_than((5, 20))
    monkeypatch.setenv(RELEASE_VARIABLE, "5.20.0")
    assert not runs_older_than((5, 20))


def permuted_bias(heads=4, length=6):
    return torch.randn(length, length, heads).permute([2, 0, 1]).unsqueeze(0)


@pytest.mark.parametrize("mask_kind", ["none", "causal", "bool", "float"])
def test_old_mask_has_the_installed_values_in_the_bias_layout(mask_kind):
    bias = permuted_bias()
    query = key = torch.randn(2, 4, 6, 8)
    mask = {"none": None, "causal": None,
            "bool": torch.rand(2, 1, 6, 6) > 0.3,
            "float": torch.randn(2, 1, 6, 6)}[mask_kind]
    is_causal = mask_kind == "causal"
    installed = sdpa_attention.create_position_bias_mask(bias, mask, is_causal, query, key)
    old = position_bias_mask_as_is(bias, mask, is_causal, query, key)
    torch.testing.assert_close(old, installed, rtol=0, atol=0)
    assert old.stride(-1) != 1  # what CUDA's fused backends refuse


def t5_step(length=64):
    def job():
        config = transformers.T5Config(d_model=64, d_ff=128, d_kv=16, num_layers=2, num_heads=4,
                                       vocab_size=100, decoder_start_token_id=0, pad_token_id=0)
        config.use_cache, config._attn_implementation = False, "sdpa"  # as the zoo job
        model = transformers.T5ForConditionalGeneration(config).cuda().train()
        ids = torch.randint(0, 100, (2, length), device="cuda")
        model(input_ids=ids, labels=ids).loss.backward()
    return job


@pytest.fixture
def backends(monkeypatch):
    chosen = []
    choose = sdpa.choose_backend

    def recorded(capability, q, k, v, mask, is_causal=False, **kwargs):
        backend = choose(capability, q, k, v, mask, is_causal, **kwargs)
        chosen.append(backend)
        return backend

    monkeypatch.setattr(sdpa, "choose_backend", recorded)
    return chosen


@pytest.mark.parametrize("release, self_attention", [
    ("5.17.0", sdpa.SdpaBackend.MATH), ("", sdpa.SdpaBackend.EFFICIENT)])
def test_t5_self_attention_backend_follows_the_target_release(monkeypatch, backends, release,
                                                              self_attention):
    monkeypatch.setenv(RELEASE_VARIABLE, release)
    result = capture_callable(t5_step(), gpu=load_gpu("h200"), stack=load_stack("2.11"))
    assert result.error is None, result.error_text
    # encoder self x2, then per decoder layer self and cross attention
    efficient = sdpa.SdpaBackend.EFFICIENT
    assert backends == [self_attention] * 2 + [self_attention, efficient] * 2


def test_the_installed_function_is_back_after_the_capture(monkeypatch):
    from peakmem.capture.library_patches import library_patches

    installed = sdpa_attention.create_position_bias_mask
    monkeypatch.setenv(RELEASE_VARIABLE, "5.17.0")
    with library_patches():
        assert sdpa_attention.create_position_bias_mask is not installed
        bias = permuted_bias()
        query = torch.randn(2, 4, 6, 8)
        assert sdpa_attention.create_position_bias_mask(bias, None, False, query, query) is bias
    assert sdpa_attention.create_position_bias_mask is installed


def test_a_malformed_release_fails_before_the_job_runs(monkeypatch):
    from peakmem.capture.hf_release import transformers_target_release
    from peakmem.inputs import InputError

    monkeypatch.setenv(RELEASE_VARIABLE, "main")
    with pytest.raises(InputError, match=RELEASE_VARIABLE), transformers_target_release():
        pass
