import torch

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations


def run(a100, stack24, train=True, inplace=False):
    def job():
        drop = torch.nn.Dropout(0.2, inplace=inplace).cuda().train(train)
        x = torch.randn(64, 128, device="cuda", requires_grad=not inplace)
        y = drop(x * 1 if inplace else x)
        if train and not inplace:
            del y  # keep the graph (and its saved mask) alive through backward's start
            (drop(x) * 2).sum().backward()

    return capture_callable(job, gpu=a100, stack=stack24)


def test_training_dropout_saves_a_one_byte_mask(a100, stack24):
    result = run(a100, stack24)
    forward = [(size, tag.op) for size, tag in allocations(result.trace, phase="forward")]
    # the fused kernel: bool mask (1 B/elem), then the output (4 B/elem), no 4-byte noise
    # tensor; Dropout.cu allocates the mask first (seen in H100 allocator snapshots)
    assert forward[:2] == [(64 * 128, "native_dropout.default"), (64 * 128 * 4, "native_dropout.default")]
    saved = [(size, tag.op) for size, tag in allocations(result.trace, "activation")]
    assert (64 * 128, "native_dropout.default") in saved  # the mask is kept for backward


def test_eval_dropout_allocates_nothing(a100, stack24):
    result = run(a100, stack24, train=False)
    assert allocations(result.trace, phase="forward") == []


def test_inplace_dropout_keeps_the_unfused_path(a100, stack24):
    result = run(a100, stack24, inplace=True)
    ops = {tag.op for _, tag in allocations(result.trace, phase="forward")}
    assert "native_dropout.default" not in ops


def test_dropout_inside_attention_is_fused_too(a100, stack24):
    def job():
        layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=True).cuda()
        layer(torch.randn(2, 16, 64, device="cuda")).sum().backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    ops = [tag.op for _, tag in allocations(result.trace, phase="forward")]
    assert "bernoulli_.float" not in ops and "empty_like.default" not in ops
    # three dropouts in the layer (after attention, in the feed-forward, after it): one mask each
    masks = [size for size, tag in allocations(result.trace, "activation", op="native_dropout") if size in (2 * 16 * 64, 2 * 16 * 128)]
    assert sorted(masks) == [2 * 16 * 64, 2 * 16 * 64, 2 * 16 * 128]
