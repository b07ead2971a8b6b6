"""Round 2 of well-known training scripts re-created and run unmodified through the real CLI
(`python -m peakmem estimate --json -- python SCRIPT ARGS`, scripts/r2_*.py): the parameter and
optimizer bytes are worked out by hand from each script's layers (expected.py's helpers), not
read from peakmem."""

from __future__ import annotations

import importlib.util

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import estimate, estimate_here
from tests.library_jobs.test_library_jobs import assert_training, needs


def _notes(est) -> str:
    return "\n".join(est.data["notes"])


def test_wgan_gp_double_backward_two_adams(tmp_path):
    generator = ex.linear(128, 64) + ex.linear(256, 128) + ex.linear(784, 256)
    critic = ex.linear(256, 784) + ex.linear(128, 256) + ex.linear(1, 128)
    params = ex.device_bytes(generator + critic, ex.FP32)
    est = estimate_here("r2_wgan_gp.py", "--outf", str(tmp_path))
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
    est = estimate_here("r2_distillation.py")
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
    est = estimate_here("r2_char_rnn.py", "--cuda", "--chunk_len", "20", "--save",
                        str(tmp_path / "char.pt"))
    # decoder.zero_grad() sets the gradients to None before each chunk's forward, whose
    # 20 steps of activations are the peak: no gradient is live there
    assert_training(est, params=params, optimizer_state=2 * params, grads=0)
    # the epoch loop (no DataLoader) was ended after 3 steps: the save after it ran
    assert est.data["steps"] == 3 and not est.data["stopped"]
    assert "ended 1 training loop(s) without a DataLoader" in _notes(est), _notes(est)
    assert "Saved as" in est.stderr


def test_moco_momentum_encoder_and_queue_buffer(tmp_path):
    encoder = (ex.conv(32, 3, 3, bias=False) + ex.norm(32) + ex.conv(64, 32, 3, bias=False)
               + ex.norm(64) + ex.linear(64, 64) + ex.linear(128, 64))  # --mlp head
    one = ex.device_bytes(encoder, ex.FP32)
    est = estimate_here("r2_moco.py", "--mlp", "--checkpoint-dir", str(tmp_path))
    # SGD momentum for the query encoder only (the key encoder's parameters have no grad);
    # the key encoder's weights, replaced by `param_k.data = ...` from the query encoder's in
    # each forward, are a copy kept in sync: `ema` (they were counted as activations, then as
    # parameters before)
    assert_training(est, params=one, optimizer_state=one, grads=one, extra_lower=one)
    assert est.breakdown.get("ema") == one, est.breakdown
    queue = ex.rounded(128 * 4096 * ex.FP32) + ex.BLOCK  # queue + queue_ptr
    bn = [(32,), (32,), (), (64,), (64,), ()]
    assert est.breakdown["buffer"] == queue + 2 * ex.device_bytes(bn, ex.FP32)
    assert "checkpoint_0000.pth.tar" in _notes(est)


def test_seq2seq_gru_attention_teacher_forcing_two_adams():
    hidden, words_in, words_out = 128, 600, 800
    gru_in = [(3 * hidden, hidden), (3 * hidden, hidden), (3 * hidden,), (3 * hidden,)]
    gru_dec = [(3 * hidden, 2 * hidden), (3 * hidden, hidden), (3 * hidden,), (3 * hidden,)]
    encoder = [(words_in, hidden), *gru_in]
    decoder = [(words_out, hidden), *ex.linear(hidden, hidden), *ex.linear(hidden, hidden),
               *ex.linear(1, hidden), *gru_dec, *ex.linear(words_out, hidden)]
    params = ex.device_bytes(encoder + decoder, ex.FP32)
    est = estimate_here("r2_seq2seq_gru.py")
    # both zero_grad()s set the gradients to None: the peak is the decoder's 10 unrolled steps
    assert_training(est, params=params, optimizer_state=2 * params, grads=0)
    # the whole dataset was moved to the device before the DataLoader (TensorDataset on cuda)
    assert est.breakdown["input"] >= 2 * ex.rounded(320 * 10 * 8)
    assert est.data["phases_ran"] == ["training", "eval"]  # evaluateRandomly after training


def test_gcn_sparse_adjacency_full_batch():
    nodes, features, hidden, classes = 2708, 1433, 16, 7
    params = ex.device_bytes([(features, hidden), (hidden, classes)], ex.FP32)  # no bias
    est = estimate_here("r2_gcn.py")
    # torch.spmm(adj, x @ W) on the fake device (it was "aten::mm has no meta kernel", and
    # eager mode refuses sparse CUDA tensors: no estimate at all)
    assert_training(est, params=params, optimizer_state=2 * params)
    dense = ex.rounded(nodes * features * ex.FP32) + ex.rounded(nodes * 8)  # features, labels
    masks = ex.rounded(140 * 8) + ex.rounded(300 * 8) + ex.rounded(1000 * 8)
    # the adjacency's indices (2 x nnz int64) and values (nnz fp32), nnz >= the self-loops;
    # before, the moved sparse tensor kept no entries and took no memory
    adjacency = ex.rounded(2 * nodes * 8) + ex.rounded(nodes * 4)
    assert est.breakdown["input"] >= dense + masks + adjacency, est.breakdown
    # the epoch loop (no DataLoader) was ended after 3 steps: the test pass after it ran
    assert est.data["steps"] == 3 and not est.data["stopped"]
    assert "ended 1 training loop(s) without a DataLoader" in _notes(est)
    assert "Test set results" in est.stderr


def test_siamese_pairs_adadelta_steplr_eval_sets_the_peak(tmp_path):
    shapes = (ex.conv(32, 1, 3) + ex.norm(32) + ex.conv(64, 32, 3) + ex.norm(64)
              + ex.linear(256, 128) + ex.linear(1, 256))
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate_here("r2_siamese.py", "--epochs", "2", "--save-model")
    assert est.returncode == 0, est.failure()
    assert est.breakdown["parameter"] == params
    assert est.breakdown["optimizer_state"] == 2 * params  # Adadelta: square_avg, acc_delta
    # the test batch of 1000 pairs: two 32-channel 26 x 26 maps per image
    assert "the peak was set by the evaluation after training" in _notes(est)
    assert est.data["peak_allocated_bytes"] >= 2 * 1000 * 32 * 26 * 26 * ex.FP32
    assert "siamese_network.pt" in _notes(est)


def test_mnist_rnn_lstm_accelerator_api(tmp_path):
    shapes = ex.lstm_shapes(28, 64, 1) + ex.norm(64) + ex.linear(32, 64) + ex.linear(10, 32)
    params = ex.device_bytes(shapes, ex.FP32)
    # --accel: torch.accelerator.is_available() / current_accelerator() see the fake GPU
    est = estimate_here("r2_mnist_rnn.py", "--accel", "--epochs", "2", "--save-model")
    assert est.returncode == 0, est.failure()
    assert est.breakdown["parameter"] == params
    assert est.breakdown["optimizer_state"] == 2 * params
    assert est.breakdown["buffer"] == ex.device_bytes([(64,), (64,), ()], ex.FP32)
    assert "DataLoader epoch of 20 batches" in _notes(est)


def _vit_block(d: int) -> list:
    """timm's Block (qkv_bias, no LayerScale): norm1, qkv, proj, norm2, fc1, fc2."""
    return (ex.norm(d) + ex.linear(3 * d, d) + ex.linear(d, d) + ex.norm(d)
            + ex.linear(4 * d, d) + ex.linear(d, 4 * d))


def test_mae_pretrain_native_scaler_accum_iter_frozen_pos_embed(tmp_path):
    d, dec, patches = 64, 32, (32 // 4) ** 2
    frozen = [(1, patches + 1, d), (1, patches + 1, dec)]  # sin-cos pos_embed, requires_grad=False
    trained = [(d, 3, 4, 4), (d,), (1, 1, d), *(2 * _vit_block(d)), *ex.norm(d),
               *ex.linear(dec, d), (1, 1, dec), *_vit_block(dec), *ex.norm(dec),
               *ex.linear(4 * 4 * 3, dec)]
    params = ex.device_bytes(trained + frozen, ex.FP32)
    adam = 2 * ex.device_bytes(trained, ex.FP32)  # add_weight_decay leaves the frozen ones out
    est = estimate("r2_mae_pretrain.py", "--output_dir", str(tmp_path))
    # `step / len(loader) + epoch` picks the warm-up or the cosine phase: the epoch that
    # waited for its accumulation steps said len 4 while yielding a 5th batch, and the
    # cosine phase divided by zero (epochs == warmup_epochs)
    assert_training(est, params=params, optimizer_state=adam,
                    grads=ex.device_bytes(trained, ex.FP32))
    assert "traced 2 optimizer steps over 5 batches (accumulation window 2)" in _notes(est)
    assert "checkpoint-0.pth" in _notes(est)


@needs("torchvision")
def test_torchvision_classification_reference_ema_amp_mixup_cutmix(tmp_path):
    shapes, buffers = ex.resnet18_shapes(10)
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate("r2_torchvision_classification.py", "--data-path", "fake", "--model", "resnet18",
                   "--num-classes", "10", "-b", "8", "--epochs", "2", "--lr-warmup-epochs", "1",
                   "--amp", "--clip-grad-norm", "1.0", "--label-smoothing", "0.1",
                   "--mixup-alpha", "0.2", "--cutmix-alpha", "1.0", "--model-ema",
                   "--model-ema-steps", "2", "--norm-weight-decay", "0.0", "--val-resize-size", "72",
                   "--val-crop-size", "64", "--train-crop-size", "64", "-j", "2",
                   "--output-dir", str(tmp_path))
    # the EMA (AveragedModel, a deepcopy on the device) holds a second copy of the weights and,
    # with use_buffers=True, of the BatchNorm buffers, plus its n_averaged counter. Its weights
    # keep requires_grad (deepcopy) but no optimizer steps them: its first update_parameters
    # reads `bool(self.n_averaged == 0)` (a known 0: torch.tensor(0, device=...)) and copies
    # the trained weights into them, as on a GPU, so they are `ema`, not `parameter`
    assert_training(est, params=params, optimizer_state=params, grads=params,
                    extra_lower=params)
    assert est.breakdown["ema"] == params
    assert est.breakdown["buffer"] == 2 * ex.device_bytes(buffers, ex.FP32) + ex.BLOCK
    # SGD momentum over both set_weight_decay groups, every parameter once
    assert est.breakdown["optimizer_state"] == params
    assert est.data["phases_ran"] == ["training", "eval", "training", "eval"]
    assert "model_1.pth" in _notes(est)


@pytest.mark.parametrize(("script", "module"), [("r2_actor_critic.py", "gym"),
                                                ("r2_language_translation.py", "torchtext")])
def test_a_missing_library_fails_in_one_line(script, module):
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed")
    est = estimate(script)
    assert est.returncode == 1
    assert est.data["error"]["message"] == f"the job raised ModuleNotFoundError: No module named '{module}'"


def test_byol_lazy_projector_deepcopy_target_moving_average(tmp_path):
    encoder = ex.conv(32, 3, 3) + ex.norm(32) + ex.conv(64, 32, 3) + ex.norm(64)
    mlp = ex.linear(256, 64) + ex.norm(256) + ex.linear(64, 256)  # projector and predictor
    online = encoder + mlp + mlp
    trained = ex.device_bytes(online, ex.FP32)
    target = ex.device_bytes(encoder + mlp, ex.FP32)
    est = estimate_here("r2_byol.py", "--save", str(tmp_path / "encoder.pt"))
    # the projector is built on the first call by `MLP(...).to(hidden)` (it went to the meta
    # device before: no weights, gradients or Adam state); the target network (a deepcopy,
    # frozen, replaced by `.data =` from the online network after each step) is `ema`
    assert_training(est, params=trained, optimizer_state=2 * trained, grads=trained,
                    extra_lower=target)
    assert est.breakdown.get("ema") == target, est.breakdown
    bn = [(32,), (32,), (), (64,), (64,), ()]
    bn_mlp = [(256,), (256,), ()]
    assert est.breakdown["buffer"] == ex.device_bytes(2 * bn + 3 * bn_mlp, ex.FP32)
    assert "encoder.pt" in _notes(est)
