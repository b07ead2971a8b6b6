"""Round 2 of well-known training scripts re-created and run unmodified through the real CLI
(`python -m peakmem estimate --json -- python SCRIPT ARGS`, scripts/r2_*.py): the parameter and
optimizer bytes are worked out by hand from each script's layers (expected.py's helpers), not
read from peakmem."""

from __future__ import annotations

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import estimate
from tests.library_jobs.test_library_jobs import assert_training


def _notes(est) -> str:
    return "\n".join(est.data["notes"])


def test_wgan_gp_double_backward_two_adams(tmp_path):
    generator = ex.linear(128, 64) + ex.linear(256, 128) + ex.linear(784, 256)
    critic = ex.linear(256, 784) + ex.linear(128, 256) + ex.linear(1, 128)
    params = ex.device_bytes(generator + critic, ex.FP32)
    est = estimate("r2_wgan_gp.py", "--outf", str(tmp_path))
    # both Adams have stepped (the generator at i % n_critic == 0): two moments per parameter
    assert_training(est, params=params, optimizer_state=2 * params)
    # the gradient penalty's autograd.grad(create_graph=True) and the critic's backward through
    # it ran on fake tensors: at most the critic's gradients are live during its step
    assert est.breakdown["gradient"] >= ex.device_bytes(critic, ex.FP32)
    assert "DataLoader epoch of 10 batches" in _notes(est)
    assert "generator_0.pth" in _notes(est)


def test_knowledge_distillation_teacher_then_student():
    teacher = (ex.conv(128, 3, 3) + ex.conv(64, 128, 3) + ex.conv(64, 64, 3) + ex.conv(32, 64, 3)
               + ex.linear(512, 2048) + ex.linear(10, 512))
    student = ex.conv(16, 3, 3) + ex.conv(16, 16, 3) + ex.linear(256, 1024) + ex.linear(10, 256)
    est = estimate("r2_distillation.py")
    # the teacher's own training (Adam) is the peak; the student (a quarter of its size) trains
    # later against the teacher in eval() under no_grad, both evaluations run after each
    params = ex.device_bytes(teacher, ex.FP32)
    first_conv = 32 * 128 * 32 * 32 * ex.FP32  # one 128-channel 32 x 32 map of a batch of 32
    # above the model state: a few such maps and a cuDNN convolution workspace
    assert_training(est, params=params, optimizer_state=2 * params,
                    extra_upper=3 * first_conv + 64 * 2**20)
    assert est.breakdown["activation"] >= first_conv
    assert est.data["phases_ran"].count("training") == 2
    assert est.data["phases_ran"].count("eval") >= 2
    assert "the peak was set during training" in _notes(est)
    assert ex.device_bytes(student, ex.FP32) < params // 4


def test_char_rnn_gru_truncated_bptt_without_a_dataloader(tmp_path):
    gru = [(300, 100), (300, 100), (300,), (300,)] * 2  # nn.GRU(100, 100, 2): 3 gates
    params = ex.device_bytes([(100, 100), *gru, *ex.linear(100, 100)], ex.FP32)
    est = estimate("r2_char_rnn.py", "--cuda", "--chunk_len", "20", "--save",
                   str(tmp_path / "char.pt"))
    # decoder.zero_grad() sets the gradients to None before each chunk's forward, whose
    # 20 steps of activations are the peak: no gradient is live there
    assert_training(est, params=params, optimizer_state=2 * params, grads=0)
    assert est.data["steps"] == 3
    assert "does not iterate a DataLoader" in _notes(est)


def test_moco_momentum_encoder_and_queue_buffer(tmp_path):
    encoder = (ex.conv(32, 3, 3, bias=False) + ex.norm(32) + ex.conv(64, 32, 3, bias=False)
               + ex.norm(64) + ex.linear(64, 64) + ex.linear(128, 64))  # --mlp head
    one = ex.device_bytes(encoder, ex.FP32)
    est = estimate("r2_moco.py", "--mlp", "--checkpoint-dir", str(tmp_path))
    # SGD momentum for the query encoder only (the key encoder's parameters have no grad);
    # the key encoder's weights, replaced by `param_k.data = ...` in each forward, are
    # parameters too (they were counted as activations before)
    assert_training(est, params=2 * one, optimizer_state=one, grads=one)
    queue = ex.rounded(128 * 4096 * ex.FP32) + ex.BLOCK  # queue + queue_ptr
    bn = [(32,), (32,), (), (64,), (64,), ()]
    assert est.breakdown["buffer"] == queue + 2 * ex.device_bytes(bn, ex.FP32)
    assert "checkpoint_0000.pth.tar" in _notes(est)
