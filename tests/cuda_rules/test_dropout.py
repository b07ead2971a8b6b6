import torch
from trace_helpers import allocations

from peakmem.capture import capture_callable


def run(a100, stack24, train=True, inplace=False):
    def job():
        drop = torch.nn.Dropout(0.2, inplace=inplace).cuda().train(train)
        x = torch.randn(64, 128, device="cuda", requires_grad=not inplace)
        drop(x * 1 if inplace else x)

    return capture_callable(job, gpu=a100, stack=stack24)


def test_training_dropout_saves_a_one_byte_mask(a100, stack24):
    result = run(a100, stack24)
    forward = [(size, tag.op) for size, tag in allocations(result.trace, phase="forward")]
    # the fused kernel: output (4 B/elem) + bool mask (1 B/elem), no 4-byte noise tensor
    assert forward == [(64 * 128 * 4, "native_dropout.default"), (64 * 128, "native_dropout.default")]
    mask = [size for size, tag in allocations(result.trace, "activation") if size == 64 * 128]
    assert mask == [64 * 128]


def test_eval_dropout_allocates_nothing(a100, stack24):
    result = run(a100, stack24, train=False)
    assert allocations(result.trace, phase="forward") == []


def test_inplace_dropout_keeps_the_unfused_path(a100, stack24):
    result = run(a100, stack24, inplace=True)
    ops = {tag.op for _, tag in allocations(result.trace, phase="forward")}
    assert "native_dropout.default" not in ops
