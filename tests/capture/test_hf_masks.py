"""transformers' packed-sequence check in a capture (capture/hf_masks.py): a model that builds
its own position ids gets no causal mask, as on a GPU (SDPA's is_causal), instead of a
(batch, 1, seq, seq) mask per step that sends attention to memory-efficient with a bias."""

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.capture.hf_masks import values_unknown
from peakmem.cuda_rules import sdpa

transformers = pytest.importorskip("transformers")
masking_utils = pytest.importorskip("transformers.masking_utils")


def gpt2_step(inputs):
    def job():
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=64,
                                         n_positions=64)
        config.use_cache, config._attn_implementation = False, "sdpa"  # as a training job (zoo)
        model = transformers.GPT2LMHeadModel(config).cuda().train()
        ids = torch.randint(0, 64, (2, 32), device="cuda")
        model(input_ids=ids, labels=ids, **{k: v(ids) for k, v in inputs.items()}).loss.backward()
    return job


@pytest.fixture
def attention_calls(monkeypatch):
    calls = []
    choose = sdpa.choose_backend

    def recorded(capability, q, k, v, mask, is_causal=False, **kwargs):
        calls.append((mask is None, is_causal))
        return choose(capability, q, k, v, mask, is_causal, **kwargs)

    monkeypatch.setattr(sdpa, "choose_backend", recorded)
    return calls


def test_own_positions_give_no_causal_mask_in_a_capture(a100, stack24, attention_calls):
    result = capture_callable(gpt2_step({}), gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    assert attention_calls == [(True, True), (True, True)]  # two layers, is_causal, no mask


def _without_the_patch(monkeypatch) -> None:
    from peakmem.capture import library_patches

    patches = dict(library_patches.LIBRARY_PATCHES)
    del patches["transformers_unpacked_positions"]
    monkeypatch.setattr(library_patches, "LIBRARY_PATCHES", patches)


def unknown_positions(ids):
    """0..seq-1 in each row, computed from the random ids: values the capture does not have."""
    return torch.arange(ids.shape[1], device="cuda")[None] + 0 * ids


def test_without_the_patch_unknown_positions_mask_every_layer(a100, stack24, attention_calls,
                                                              monkeypatch):
    _without_the_patch(monkeypatch)
    step = gpt2_step({"position_ids": unknown_positions})
    result = capture_callable(step, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    assert attention_calls == [(False, False), (False, False)]  # the packed-sequence mask


def test_with_the_patch_unknown_positions_give_no_causal_mask(a100, stack24, attention_calls):
    step = gpt2_step({"position_ids": unknown_positions})
    result = capture_callable(step, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    assert attention_calls == [(True, True), (True, True)]


def test_without_the_patch_the_models_own_positions_are_known_values(a100, stack24,
                                                                      attention_calls,
                                                                      monkeypatch):
    """GPT-2's own `torch.arange(seq, device=...)` positions (32 x 2 elements) are known values
    (capture/known_values.py): transformers' check computes `all()` True from them and skips
    the mask as on a GPU, with or without the patch."""
    _without_the_patch(monkeypatch)
    result = capture_callable(gpt2_step({}), gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    assert attention_calls == [(True, True), (True, True)]


def test_real_positions_keep_transformers_answer():
    restarting = torch.tensor([[0, 1, 2, 0, 1, 2]])
    assert masking_utils.find_packed_sequence_indices(restarting).tolist() == [[0, 0, 0, 1, 1, 1]]
    assert masking_utils.find_packed_sequence_indices(torch.arange(6)[None]) is None
    assert not values_unknown(restarting)
    assert values_unknown(torch.empty(2, device="meta"))
    assert not values_unknown(None)
