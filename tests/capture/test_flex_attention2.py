"""flex_attention as attention-gym writes it: score_mod / mask_mod closing over device tensors
(ALiBi slopes, document ids, a relative bias table), `and_masks` / `or_masks`, a BlockMask built
once and reused, `create_block_mask(_compile=True)` / `torch.compile(create_block_mask)`."""

import pytest
import torch
from torch.nn.attention.flex_attention import (
    and_masks,
    create_block_mask,
    flex_attention,
    or_masks,
)

from peakmem.capture.compiled_code import FUSED_COMPILES
from peakmem.estimate import estimate
from peakmem.trace.events import EventKind
from tests.capture.capture_helpers import allocations

B, H, M, D = 1, 2, 256, 8
DOC_LEN = 100  # documents of 100 tokens packed in one sequence
COMPILED_CREATE_BLOCK_MASK = torch.compile(create_block_mask)  # before any capture
BLOCK_MASK_NOTE = FUSED_COMPILES["torch.nn.attention.flex_attention.create_block_mask"]


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _mods(device: str):
    """attention-gym's ALiBi (`generate_alibi_bias`), document masking
    (`generate_doc_mask_mod`) and a relative-position bias table, closing over device tensors."""
    slopes = torch.exp2(-torch.arange(1, H + 1, dtype=torch.float32) * 8 / H).to(device)
    document_id = (torch.arange(M) // DOC_LEN).to(device)
    bias = torch.linspace(-1, 1, 2 * M).to(device)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    def relative(score, b, h, q_idx, kv_idx):
        return score + bias[q_idx - kv_idx + M]

    def same_document(b, h, q_idx, kv_idx):
        return document_id[q_idx] == document_id[kv_idx]

    return alibi, relative, same_document


def _dense(q, k, v, score_mod=None, mask_mod=None):
    """The attention written out on the host: scores, score_mod, mask, softmax."""
    b, h, i, j = (torch.arange(n).view([-1 if d == axis else 1 for d in range(4)])
                  for axis, n in enumerate((B, H, M, M)))
    scores = q @ k.transpose(-2, -1) * D ** -0.5
    if score_mod is not None:
        scores = score_mod(scores, b, h, i, j)
    if mask_mod is not None:
        scores = scores.masked_fill(~mask_mod(b, h, i, j), -float("inf"))
    return scores.softmax(-1) @ v


def _attend_all(inputs, device: str) -> list[torch.Tensor]:
    """Four attentions and the gradients of q, k, v: flex_attention on the device, or written
    out on the host."""
    alibi, relative, same_document = _mods(device)
    q, k, v = (t.to(device).detach().requires_grad_() for t in inputs)
    if device == "cpu":
        outs = [_dense(q, k, v, score_mod=alibi), _dense(q, k, v, score_mod=relative),
                _dense(q, k, v, mask_mod=and_masks(causal, same_document)),
                _dense(q, k, v, alibi, or_masks(causal, same_document))]
    else:
        documents = create_block_mask(and_masks(causal, same_document), B, H, M, M, device=device)
        either = create_block_mask(or_masks(causal, same_document), None, None, M, M,
                                   device=device)
        outs = [flex_attention(q, k, v, score_mod=alibi),
                flex_attention(q, k, v, score_mod=relative),
                flex_attention(q, k, v, block_mask=documents),
                flex_attention(q, k, v, score_mod=alibi, block_mask=either)]
    sum(out.square().sum() for out in outs).backward()
    return [out.detach().cpu() for out in outs] + [t.grad.cpu() for t in (q, k, v)]


def test_eager_mode_mods_closing_over_device_tensors_give_the_real_values():
    torch.manual_seed(0)
    inputs = [torch.randn(B, H, M, D) for _ in range(3)]
    expected = _attend_all(inputs, "cpu")
    seen = []
    result = estimate(lambda: seen.extend(_attend_all(inputs, "cuda")), gpu="a100-40gb",
                      steps="all", mode="eager")
    assert result.capture.error is None, result.capture.error_text
    assert not [note for note in result.notes if "made outside the capture" in note]
    assert len(seen) == len(expected)
    for got, want in zip(seen, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def _build_mask(how: str):
    _, _, same_document = _mods("cuda")
    mask_mod = and_masks(causal, same_document)
    if how == "eager":
        return create_block_mask(mask_mod, B, H, M, M, device="cuda")
    if how == "_compile":
        return create_block_mask(mask_mod, B, H, M, M, device="cuda", _compile=True)
    if how == "compiled before the capture":
        return COMPILED_CREATE_BLOCK_MASK(mask_mod, B, H, M, M, device="cuda")
    return torch.compile(create_block_mask)(mask_mod, B, H, M, M, device="cuda")


@pytest.mark.parametrize("how", ["eager", "_compile", "torch.compile",
                                 "compiled before the capture"])
def test_compiled_create_block_mask_keeps_no_dense_mask(how):
    def job():
        block_mask = _build_mask(how)
        assert tuple(block_mask.kv_num_blocks.shape) == (B, H, M // 128)

    result = estimate(job, gpu="a100-40gb", steps="all", mode="fake")
    assert result.capture.error is None, result.capture.error_text
    sizes = [size for size, _ in allocations(result.capture.trace)]
    dense_mask = B * H * M * M  # bool
    compiled = how != "eager"
    assert (max(sizes) < dense_mask) is compiled
    assert (BLOCK_MASK_NOTE in result.notes) is compiled
    # the BlockMask's int32 tables stay: kv_num_blocks (B x H x M/128) among them
    tables = [size for size, tag in allocations(result.capture.trace, op="_to_copy")]
    assert B * H * (M // 128) * 4 in tables


def test_a_block_mask_built_once_serves_every_step():
    def job():
        _, _, same_document = _mods("cuda")
        block_mask = create_block_mask(and_masks(causal, same_document), B, H, M, M,
                                       device="cuda", _compile=True)
        proj = torch.nn.Linear(D, D).cuda()
        optimizer = torch.optim.SGD(proj.parameters(), lr=0.1)
        for _ in range(3):
            q, k, v = (proj(torch.randn(B, H, M, D, device="cuda")) for _ in range(3))
            flex_attention(q, k, v, block_mask=block_mask).sum().backward()
            optimizer.step()
            optimizer.zero_grad()

    result = estimate(job, gpu="a100-40gb", steps="all", mode="fake")
    assert result.capture.error is None, result.capture.error_text
    assert result.capture.steps == 3
    forward_outputs = [s for s, tag in allocations(result.capture.trace) if tag.op == "flex_attention"]
    assert forward_outputs == [B * H * M * D * 4, B * H * M * 4, B * H * M * 4] * 3
    # the mask's tables (int32, from `_to_copy`) were all made before the first step
    trace = result.capture.trace
    ops = [trace.tag_of(i).op for i, (kind, *_rest) in enumerate(trace.events())
           if kind == EventKind.ALLOC]
    first_attention = ops.index("flex_attention")
    tables = [i for i, op in enumerate(ops) if op.startswith("_to_copy")]
    assert tables and max(tables) < first_attention


def _learnable_bias(inputs, device: str) -> list[torch.Tensor]:
    """A relative-position bias table the score_mod closes over and that learns (attention-gym's
    learnable bias): its gradient, as torch's flex_attention (Dynamo lifting the table into the
    operator's buffers) gives it; on the host, written out."""
    bias = torch.linspace(-1, 1, 2 * M).to(device).requires_grad_()

    def relative(score, b, h, q_idx, kv_idx):
        return score + bias[q_idx - kv_idx + M]

    q, k, v = (t.to(device) for t in inputs)
    attend = _dense if device == "cpu" else flex_attention
    attend(q, k, v, score_mod=relative).square().sum().backward()
    assert bias.grad is not None
    return [bias.grad.cpu()]


@pytest.mark.parametrize("mode", ["fake", "eager"])
def test_a_learnable_bias_closed_over_gets_its_gradient(mode):
    torch.manual_seed(0)
    inputs = [torch.randn(B, H, M, D) for _ in range(3)]
    seen = []
    result = estimate(lambda: seen.extend(_learnable_bias(inputs, "cuda")), gpu="a100-40gb",
                      steps="all", mode=mode)
    assert result.capture.error is None, result.capture.error_text
    grads = [s for s, tag in allocations(result.capture.trace) if tag.op == "flex_attention_backward"]
    assert grads[3:] == [2 * M * 4]  # after grad_query/value/key: the table's fp32 gradient
    if mode == "eager":
        torch.testing.assert_close(seen[0], _learnable_bias(inputs, "cpu")[0], rtol=1e-4, atol=1e-4)
