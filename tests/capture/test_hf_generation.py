"""transformers' `generate` ends at its max length in fake mode (capture/hf_generation.py):
before, `this_peer_finished` (a device value) read as False and the decoding loop never ended."""

import pytest
import torch

from peakmem.capture import capture_callable

transformers = pytest.importorskip("transformers")


class CountedCalls(transformers.StoppingCriteria):
    """Never stops by itself; fails the job past 50 decoding steps (instead of hanging)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, input_ids, scores, **kwargs):
        self.calls += 1
        if self.calls > 50:
            raise RuntimeError("generate did not stop at its max length")
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def test_generate_stops_at_max_new_tokens_in_fake_mode(a100, stack24):
    seen = {}

    def job():
        config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64,
                                         bos_token_id=0, eos_token_id=1, pad_token_id=0)
        model = transformers.GPT2LMHeadModel(config).cuda().eval()
        prompt = torch.randint(2, 64, (2, 5), device="cuda")
        counter = CountedCalls()
        with torch.no_grad():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4,
                                 do_sample=False, stopping_criteria=transformers.StoppingCriteriaList([counter]))
        seen["shape"], seen["calls"] = tuple(out.shape), counter.calls

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    assert seen == {"shape": (2, 9), "calls": 4}
