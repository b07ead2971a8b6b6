"""Training scripts written as people write them with the real libraries, estimated end to end.

Each script under scripts/ imitates a well-known project's style (transformers, PEFT,
accelerate, Lightning, timm, torchvision, nanoGPT, pytorch/examples, minGPT, litgpt) on a tiny
model, and runs through the real CLI (`python -m peakmem estimate --json -- python SCRIPT`),
or, where the test checks the capture and not the child process, through the same estimate in
the test's process (harness.estimate_here: the same JSON object). The expected parameter and optimizer bytes are worked out from the scripts' configs
(expected.py), not from peakmem's output. Each one failed before issue 12's fixes (tied weights
through `.to`, device tensors that report `cuda`, the fake runtime's holes, host-built models,
training without torch.optim); the suite keeps them fixed.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import JobEstimate, estimate, estimate_here

MiB = 2**20
WORKSPACE_SLACK = 96 * MiB
"""Room above twice the model state for a tiny job: two cuBLAS workspaces (2 x 32 MiB on an
H100) and a few MiB of activations."""


def needs(*modules: str) -> pytest.MarkDecorator:
    """Skip when one of these libraries is not installed (torchvision is installed apart, with
    --no-deps: see .ci/run)."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    return pytest.mark.skipif(bool(missing), reason=f"not installed: {', '.join(missing)}")


def assert_training(
    est: JobEstimate,
    *,
    params: int,
    optimizer_state: int | tuple[int, ...],
    grads: int | None = None,
    extra_lower: int = 0,
    extra_upper: int = 0,
) -> None:
    """Exit 0, a training estimate, parameter and optimizer bytes as worked out, and a peak
    between the model state (params + grads + optimizer state, all live at the optimizer step)
    and a sane bound above it."""
    assert est.returncode == 0, est.failure()
    data = est.data
    assert data["estimate_kind"] == "training"
    assert data["steps"] >= 1
    assert est.breakdown.get("parameter") == params, (est.breakdown, params)
    allowed = optimizer_state if isinstance(optimizer_state, tuple) else (optimizer_state,)
    assert est.breakdown.get("optimizer_state", 0) in allowed, (est.breakdown, allowed)
    grads = params if grads is None else grads
    lower = params + grads + min(allowed) + extra_lower
    upper = 2 * lower + WORKSPACE_SLACK + extra_upper
    assert lower <= data["peak_allocated_bytes"] <= upper, (data["peak_allocated_bytes"], lower, upper)
    assert data["peak_allocated_bytes"] <= data["peak_reserved_bytes"] <= data["peak_bytes"]
    if "gradient" in est.breakdown:
        assert est.breakdown["gradient"] <= grads


def fused_steps(shapes: list) -> int:
    """Fused (or capturable) AdamW keeps each parameter's `step` as a 0-d fp32 device tensor."""
    return ex.BLOCK * len(shapes)


# 1. transformers, plain loop -------------------------------------------------------------------

@needs("transformers")
def test_transformers_plain_loop_gpt2_from_config():
    params = ex.device_bytes(ex.gpt2_shapes(**ex.TINY_GPT2), ex.FP32)
    est = estimate_here("hf_causal_lm_loop.py", "--steps", "3")
    assert_training(est, params=params, optimizer_state=2 * params)


# 2. transformers Trainer -----------------------------------------------------------------------

@needs("transformers")
def test_transformers_trainer_on_a_torch_dataset():
    shapes = ex.gpt2_shapes(**ex.TINY_GPT2)
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate_here("hf_trainer.py", "--max-steps", "3")  # the child path: run_clm's (r6, ds3)
    # Trainer's default optimizer is fused AdamW on recent transformers ("adamw_torch_fused"),
    # plain AdamW on older ones.
    assert_training(est, params=params,
                    optimizer_state=(2 * params + fused_steps(shapes), 2 * params))
    assert any("DataLoader epoch" in note for note in est.data["notes"]), est.data["notes"]


# 3. from_pretrained(local_dir, torch_dtype=bf16) -----------------------------------------------

@needs("transformers", "safetensors")
def test_transformers_from_pretrained_local_bf16(llama_checkpoint):
    params = ex.device_bytes(ex.llama_shapes(**ex.TINY_LLAMA), ex.BF16)
    est = estimate_here("hf_from_pretrained.py", str(llama_checkpoint), "--steps", "2")
    # bf16 weights: gradients and Adam moments are bf16 too (torch keeps the parameter's dtype)
    assert_training(est, params=params, optimizer_state=2 * params)


# 4. PEFT LoRA ------------------------------------------------------------------------------------

@needs("transformers", "peft")
def test_peft_lora_only_adapters_train():
    base = ex.device_bytes(ex.llama_shapes(**ex.TINY_LLAMA), ex.FP32)
    adapters = ex.device_bytes(ex.lora_shapes(8, **ex.TINY_LLAMA), ex.FP32)
    est = estimate_here("peft_lora.py", "--steps", "2", "--rank", "8")
    assert_training(est, params=base + adapters, grads=adapters, optimizer_state=2 * adapters)


# 5. accelerate -----------------------------------------------------------------------------------

@needs("accelerate")
@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_accelerate_prepare_and_backward(precision):
    params = ex.device_bytes(ex.mlp3_shapes(), ex.FP32)
    # in this process, one after the other (accelerate's child path: test_library_jobs_r4.py, r6)
    est = estimate_here("accelerate_loop.py", "--mixed-precision", precision)
    assert_training(est, params=params, optimizer_state=2 * params)


# 6. Lightning Fabric -----------------------------------------------------------------------------

@needs("lightning")
def test_lightning_fabric_bf16_mixed():
    params = ex.device_bytes(ex.mlp3_shapes(), ex.FP32)
    est = estimate_here("fabric_loop.py", "--steps", "2")  # Lightning's child path: r4, r6
    assert_training(est, params=params, optimizer_state=2 * params)


# 7. Lightning Trainer ----------------------------------------------------------------------------

@needs("lightning")
def test_lightning_trainer_one_gpu():
    params = ex.device_bytes(ex.mlp3_shapes(), ex.FP32)
    est = estimate_here("lightning_trainer.py", "--max-steps", "2")
    assert_training(est, params=params, optimizer_state=2 * params)


# 8. timm train.py --------------------------------------------------------------------------------

@needs("timm", "torchvision")
@pytest.mark.parametrize(
    "ema",
    [
        pytest.param(True),
        pytest.param(False),
    ],
    ids=["ema", "no-ema"],
)
def test_timm_amp_channels_last_grad_checkpointing(ema):
    shapes, buffer_shapes = ex.resnet18_shapes(classes=10)
    model = ex.device_bytes(shapes, ex.FP32)
    buffers = ex.device_bytes(buffer_shapes, ex.FP32)
    copies = 2 if ema else 1
    # in the test's process (torch + timm, no DataLoader workers): timm's child-process runs
    # are r5's loader, r8's kron and r2's MAE
    est = estimate_here("timm_train.py", "--model", "resnet18", "--steps", "2",
                        *([] if ema else ["--no-model-ema"]))
    # The EMA is a deep copy on the device kept in sync with the trained weights: its weights
    # are `ema` (its buffers, copied from the model's buffers, stay buffers).
    # SGD with momentum: one buffer per parameter.
    assert_training(est, params=model, grads=model, optimizer_state=model,
                    extra_lower=(copies - 1) * model, extra_upper=256 * MiB)
    assert est.breakdown.get("ema", 0) == (copies - 1) * model
    assert est.breakdown.get("buffer") == copies * buffers


# 9. torchvision + nn.DataParallel ----------------------------------------------------------------

@needs("torchvision")
def test_torchvision_resnet18_dataparallel_one_device():
    shapes, _ = ex.resnet18_shapes(classes=10)
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate_here("torchvision_dataparallel.py", "--steps", "2")  # torch + torchvision
    assert_training(est, params=params, optimizer_state=params, extra_upper=256 * MiB)


# 10. nanoGPT -------------------------------------------------------------------------------------

def test_nanogpt_tied_compiled_memmap_fused_adamw(tmp_path):
    data = tmp_path / "train.bin"
    np.random.default_rng(0).integers(0, 512, size=10_000).astype(np.uint16).tofile(data)
    shapes = ex.gpt2_shapes(**ex.NANOGPT)  # tied: wte is lm_head, counted once
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate_here("nanogpt_train.py", "--data", str(data), "--max-iters", "2",
                        "--dtype", "float16")  # the GradScaler path
    # device_type == "cuda" -> fused AdamW -> a device `step` per parameter
    assert_training(est, params=params, optimizer_state=2 * params + fused_steps(shapes))
    assert any("torch.compile" in note for note in est.data["notes"]), est.data["notes"]


# 11. pytorch/examples MNIST ----------------------------------------------------------------------

def test_pytorch_examples_mnist_cnn_with_larger_test_batch():
    params = ex.device_bytes(ex.mnist_cnn_shapes(), ex.FP32)
    test_batch = 1000
    # test() under no_grad at batch 1000: relu(conv1) is still held by `x` while conv2's output
    # and relu(conv2) both exist
    test_peak = test_batch * ex.FP32 * (32 * 26 * 26 + 2 * 64 * 24 * 24)
    est = estimate_here("pytorch_examples_mnist.py", "--test-batch-size", str(test_batch))
    # Adadelta: square_avg and acc_delta per parameter
    assert_training(est, params=params, optimizer_state=2 * params, extra_upper=2 * test_peak)
    assert est.data["peak_allocated_bytes"] >= params + test_peak
    # one epoch of 256 / 64 = 4 batches: the default (an epoch + 2) lets the job end by itself,
    # test() included
    assert est.data["steps"] == 4


# 12. minGPT Trainer, litgpt / torchtitan meta init ---------------------------------------------

def test_mingpt_trainer_callbacks_clip_grad_norm():
    shapes = ex.gpt2_shapes(**ex.MINGPT, tied=False)
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate_here("mingpt_trainer.py", "--max-iters", "3")
    assert_training(est, params=params, optimizer_state=2 * params)
    # the causal-mask buffer: 1 x 1 x block x block fp32 per layer
    assert est.breakdown.get("buffer") == 2 * ex.device_bytes([(1, 1, 32, 32)], ex.FP32)


@pytest.mark.parametrize("how", ["device-context", "set-default-device"])
def test_litgpt_style_meta_init_to_empty_bf16(how):
    params = ex.device_bytes(ex.litgpt_shapes(), ex.BF16)
    args = ["--steps", "2"] + (["--default-device"] if how == "set-default-device" else [])
    est = estimate_here("litgpt_meta_init.py", *args)
    assert_training(est, params=params, optimizer_state=2 * params)


# Training without torch.optim ------------------------------------------------------------------

def test_pytorch_tutorial_hand_written_sgd_is_training():
    params = ex.device_bytes(ex.linear(256, 784) + ex.linear(10, 256), ex.FP32)
    est = estimate_here("pytorch_tutorial_manual_sgd.py")
    assert_training(est, params=params, optimizer_state=0)
    assert not any("never stepped" in note for note in est.data["notes"]), est.data["notes"]


def test_an_estimate_in_this_process_is_the_one_the_cli_prints():
    """harness.estimate_here, which most torch-only scripts here use, gives what `peakmem
    estimate --json` prints for the same job: the same keys and the same figures; and the same
    error object for a job that fails."""
    here, child = estimate_here("pytorch_tutorial_manual_sgd.py"), estimate("pytorch_tutorial_manual_sgd.py")
    assert here.returncode == child.returncode == 0, child.failure()
    assert set(here.data) == set(child.data)
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "peak_bytes", "breakdown", "steps",
                "estimate_kind", "mode", "gpu", "phases_ran"):
        assert here.data[key] == child.data[key], key
    failed_here, failed_child = (run("lbfgs_strong_wolfe.py", flags=("--mode", "fake"))
                                 for run in (estimate_here, estimate))
    assert failed_here.returncode == failed_child.returncode == 3
    assert failed_here.data["error"] == failed_child.data["error"]


# pytorch/examples imagenet: the torch.cuda runtime as scripts call it ---------------------------

def test_imagenet_style_cuda_runtime_calls():
    params = ex.device_bytes(
        [(32, 3, 3, 3), (32,), (32,), (32,), (64, 32, 3, 3), (64,), (64,), (64,),
         *ex.linear(10, 64)],
        ex.FP32,
    )
    # peakmem stops the job at its 3rd optimizer step, before the end-of-run statistics
    est = estimate_here("imagenet_style_cuda_calls.py", "--steps", "3", flags=("--gpu", "a100-40gb"))
    assert_training(est, params=params, optimizer_state=params)  # SGD momentum
    # two BatchNorm2d: running_mean, running_var, num_batches_tracked
    assert est.breakdown.get("buffer") == 6 * ex.BLOCK
    # the job saw the GPU it is estimated for: set_device, properties, current_device
    assert "Use GPU: 0 (NVIDIA A100" in est.stderr and "sm_80, 0)" in est.stderr, est.stderr[-2000:]
    assert est.data["gpu"] == "a100-40gb"


def test_imagenet_style_job_that_ends_itself_reads_memory_summary():
    est = estimate_here("imagenet_style_cuda_calls.py", "--steps", "1")
    assert est.returncode == 0, est.failure()
    assert est.data["estimate_kind"] == "training"
    # the job's own report of the fake device's statistics, printed before it ended
    assert "peak " in est.stderr and "MiB" in est.stderr


# Models built on the host ---------------------------------------------------------------------

@needs("transformers")
def test_from_config_on_the_host_does_not_hold_the_weights_in_host_ram():
    small = dict(hidden=64, layers=1, intermediate=176, vocab=320)
    large = dict(hidden=1024, layers=8, intermediate=2816, vocab=32000)

    def run(cfg):
        args = [a for key, value in cfg.items() for a in (f"--{key}", str(value))]
        # cold: `max_rss_bytes` is what the estimate cost the host, its job child included
        return estimate("hf_from_config_large.py", *args, "--steps", "2", cold=True)

    def shapes(cfg):
        return ex.llama_shapes(vocab=cfg["vocab"], hidden=cfg["hidden"],
                               intermediate=cfg["intermediate"], layers=cfg["layers"],
                               heads=cfg["hidden"] // 64, kv_heads=cfg["hidden"] // 64)

    baseline, est = run(small), run(large)
    params = ex.device_bytes(shapes(large), ex.FP32)
    assert params > 600 * MiB
    assert_training(est, params=params, optimizer_state=2 * params)
    assert baseline.returncode == 0, baseline.failure()
    # the host may hold a few layers at a time, never the model
    grown = est.max_rss_bytes - baseline.max_rss_bytes
    assert grown < params // 4, (grown, params)


# pytorch/examples, run as their READMEs run them (scripts/examples_*.py) ------------------------

def test_word_language_model_lstm_repackage_hidden_manual_sgd(tmp_path):
    params = ex.device_bytes(ex.word_lm_lstm_shapes(1000, 200, 200, 2), ex.FP32)
    est = estimate_here("examples_word_language_model.py", "--cuda", "--save", str(tmp_path / "m.pt"))
    # clip_grad_norm_ then `p.data.add_(p.grad, alpha=-lr)`: no optimizer state
    assert_training(est, params=params, optimizer_state=0)
    # a `for` over batchify'd tensor slices, no DataLoader: stopped after three updates
    assert est.data["steps"] == 3
    assert any("in-place parameter updates" in note for note in est.data["notes"])


def test_word_language_model_transformer_replaced_decoder(tmp_path):
    params = ex.device_bytes(ex.word_lm_transformer_shapes(500, 64, 128, 2), ex.FP32)
    est = estimate_here("examples_word_language_model.py", "--cuda", "--model", "Transformer",
                        "--emsize", "64", "--nhid", "128", "--nlayers", "2", "--ntokens", "500",
                        "--save", str(tmp_path / "m.pt"))
    assert_training(est, params=params, optimizer_state=0)
    # PositionalEncoding's pe buffer: 5000 x 1 x d_model fp32
    assert est.breakdown.get("buffer") == ex.rounded(5000 * 64 * ex.FP32)


def test_dcgan_two_models_two_adams(tmp_path):
    shapes, buffers = ex.dcgan_shapes(nz=100, ngf=16, ndf=16)
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate_here("examples_dcgan.py", "--cuda", "--batchSize", "16", "--ngf", "16", "--ndf",
                        "16", "--niter", "1", "--outf", str(tmp_path))
    assert_training(est, params=params, optimizer_state=2 * params)
    assert est.breakdown.get("buffer") == ex.device_bytes(buffers, ex.FP32)
    # the per-epoch torch.save of both state dicts went to the scratch directory
    assert any("netG_epoch_0.pth" in note for note in est.data["notes"]), est.data["notes"]


def test_vae_sum_reduced_bce_then_test_and_sampling():
    params = ex.device_bytes(ex.vae_shapes(), ex.FP32)
    est = estimate_here("examples_vae.py", "--epochs", "1")
    assert_training(est, params=params, optimizer_state=2 * params)
    assert any("evaluation phase" in note for note in est.data["notes"]), est.data["notes"]


def test_super_resolution_pixel_shuffle():
    params = ex.device_bytes(ex.espcn_shapes(3), ex.FP32)
    est = estimate_here("examples_super_resolution.py", "--upscale_factor", "3", "--cuda",
                        "--batchSize", "8", "--crop", "96", "--samples", "32")
    assert_training(est, params=params, optimizer_state=2 * params)
    # the conv4 output before PixelShuffle and the 96 x 96 target: activations of a batch of 8
    assert est.data["peak_allocated_bytes"] >= params * 4 + 8 * 9 * 32 * 32 * ex.FP32


def test_regression_while_true_breaks_on_a_host_read_loss():
    params = ex.device_bytes(ex.linear(1, 4), ex.FP32)
    est = estimate_here("examples_regression.py")
    assert_training(est, params=params, optimizer_state=0)
    # `if loss < 1e-3: break` reads the fake loss (zero): the loop ends after its first update,
    # whose allocations every later batch repeats
    assert est.data["steps"] == 1
    # ... and the estimate says its host reads saw zeros and may have steered the loop
    assert any("host read(s) of device values" in a and "--mode eager" in a
               for a in est.data["assumptions"]), est.data["assumptions"]


def test_mnist_hogwild_workers_train_the_shared_model():
    params = ex.device_bytes(ex.hogwild_net_shapes(), ex.FP32)
    est = estimate("examples_mnist_hogwild.py", "--cuda", "--num-processes", "2")
    # worker 0's SGD with momentum ran in the capture's process; before, the workers ran on
    # the host's CPU-only torch, failed, and the estimate was a forward one
    assert_training(est, params=params, optimizer_state=params)
    note = next(n for n in est.data["notes"] if n.startswith("multiprocessing.Process worker"))
    assert "1 more were not run" in note


def test_time_sequence_prediction_lbfgs_runs_at_its_memory_bound_in_fake_mode():
    """LBFGS without a line search runs in fake mode (capture/value_steered.py); it was a
    fake-mode limit (exit 3 with --mode fake, an eager rerun in auto mode)."""
    flat = ex.rounded(ex.count(ex.sine_lstm_shapes()) * 8)  # seq.double(): one flat fp64 vector
    est = estimate_here("examples_time_sequence_prediction.py", "--steps", "1", "--length", "5",
                        "--future", "2", flags=("--mode", "fake"))
    assert est.returncode == 0, est.failure()
    assert est.data["mode"] == "fake"
    assert est.data["steps"] == 1
    assert any("LBFGS: in fake mode each step ran at its memory bound" in note
               for note in est.data["notes"])
    # one step of max_iter = 20 iterations (the script's default): the 19th iteration's closure
    # (the last; the 20th moves without evaluating) runs with 18 (y, s) pairs of the flat
    # parameter vector's size kept (history_size 100 not reached)
    assert est.breakdown.get("optimizer_state", 0) >= 2 * 18 * flat
    assert est.stderr.count("loss:") >= 20  # 20 closure evaluations, then the test loss


@pytest.mark.slow
def test_time_sequence_prediction_double_lstmcell_lbfgs_in_eager_mode():
    params = ex.device_bytes(ex.sine_lstm_shapes(), 8)  # seq.double()
    # two LBFGS iterations (the script's default is 20): the eager run's closures are most
    # of this test's time, and the second iteration already keeps a history pair
    est = estimate_here("examples_time_sequence_prediction.py", "--steps", "1", "--length", "5",
                        "--future", "2", "--max-iter", "2", flags=("--mode", "eager"))
    assert est.returncode == 0, est.failure()
    assert est.data["mode"] == "eager"  # real values: torch's own LBFGS step (auto: fake mode)
    assert est.data["estimate_kind"] == "training"
    assert est.breakdown.get("parameter") == params
    # LBFGS keeps flat parameter-sized vectors (direction, previous gradient, history pairs)
    assert est.breakdown.get("optimizer_state", 0) >= ex.rounded(ex.count(ex.sine_lstm_shapes()) * 8)


@pytest.mark.skipif(importlib.util.find_spec("gym") is not None, reason="gym is installed")
def test_reinforce_without_gym_fails_in_one_line():
    est = estimate_here("examples_reinforce.py")
    assert est.returncode == 1
    assert est.data["error"]["message"] == "the job raised ModuleNotFoundError: No module named 'gym'"


# Other well-known training scripts ----------------------------------------------------------------

def test_pytorch_unet_amp_grad_scaler_rmsprop_channels_last():
    shapes, buffers = ex.unet_shapes(base=8)
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate_here("unet_train.py", "--amp", "--base", "8", "--batch-size", "2", "--epochs", "1")
    # RMSprop with momentum: square_avg and momentum_buffer per parameter
    assert_training(est, params=params, optimizer_state=2 * params)
    assert est.breakdown.get("buffer") == ex.device_bytes(buffers, ex.FP32)
    assert any("checkpoint_epoch1.pth" in note for note in est.data["notes"]), est.data["notes"]


def test_ddpm_with_a_deepcopy_ema_model():
    params = ex.device_bytes(ex.ddpm_unet_shapes(16), ex.FP32)
    schedule = 5 * ex.rounded(1000 * ex.FP32)  # betas, alphas_cumprod, ... as fp32 buffers
    est = estimate_here("ddpm_ema_train.py", "--dim", "16", "--batch-size", "4", "--image-size", "16")
    # the EMA copy's weights and buffers are on the device too (no gradients, no optimizer state)
    assert_training(est, params=params, optimizer_state=2 * params,
                    extra_lower=params + schedule)
    model_and_ema = sum(est.breakdown.get(k, 0)
                        for k in ("parameter", "buffer", "ema", "model_copy", "other"))
    assert model_and_ema >= 2 * (params + schedule), est.breakdown
    # the copy's weights, synced with `ema_p.lerp_(p, 1 - decay)`, are labelled `ema`; its
    # schedule buffers, deep-copied and never synced, are a model copy (capture/model_copies.py)
    assert est.breakdown.get("ema") == params, est.breakdown
    assert est.breakdown.get("model_copy") == schedule, est.breakdown
    # `cycle(dl)` re-iterates the DataLoader from a step-count loop: peakmem ends it with a note
    assert any("re-iterates its DataLoader" in note for note in est.data["notes"]), est.data["notes"]


def test_mnist_forward_forward_layer_local_adams():
    layer0 = ex.device_bytes(ex.linear(500, 784), ex.FP32)
    layer1 = ex.device_bytes(ex.linear(500, 500), ex.FP32)
    est = estimate_here("examples_mnist_forward_forward.py", "--epochs", "5", "--train_size", "2000",
                        "--test_size", "500")
    assert est.returncode == 0, est.failure()
    assert est.data["estimate_kind"] == "training" and est.data["steps"] == 3
    # Layer.train calls self.forward directly (no module hook): each layer's Adam steps make
    # its weights parameters. Each layer trains in a loop of its own without a DataLoader: the
    # first is ended at its head after 3 steps (capture/loop_ends.py) and the second layer
    # then trains its 3 steps (before loop_ends the job was stopped in the first loop: the
    # second layer was only moved, `input`)
    assert est.breakdown.get("parameter") == layer0 + layer1, est.breakdown
    assert est.breakdown.get("optimizer_state") == 2 * (layer0 + layer1)
    assert any(note.startswith("ended ") for note in est.data["notes"]), est.data["notes"]
    # the whole positive and negative sets (2000 x 784 fp32 each) are on the device
    assert est.data["peak_allocated_bytes"] >= layer0 + layer1 + 2 * 2000 * 784 * ex.FP32


@needs("torchvision")
def test_fast_neural_style_pretrained_vgg_without_network(tmp_path):
    est = estimate("examples_fast_neural_style.py", "--save-model-dir", str(tmp_path))
    assert est.returncode == 1
    message = est.data["error"]["message"]
    assert "\n" not in message
    assert "it could not reach download.pytorch.org: there is no network access here" in message


def test_cyclegan_two_generators_chained_adam_cpu_cuda_round_trip(tmp_path):
    params = ex.device_bytes(ex.cyclegan_shapes(ngf=8, ndf=8, n_blocks=2), ex.FP32)
    batch = 2 * ex.rounded(3 * 64 * 64 * ex.FP32)  # real_A, real_B
    est = estimate_here("cyclegan_train.py", "--ngf", "8", "--ndf", "8", "--n_blocks", "2",
                        "--crop_size", "64", "--checkpoints_dir", str(tmp_path))
    assert est.returncode == 0, est.failure()
    assert est.data["estimate_kind"] == "training"
    assert est.breakdown.get("optimizer_state") == 2 * params  # both Adams, all four networks
    # `net.cpu(); torch.save(...); net.cuda()` at each epoch's end while the last iteration's
    # graph is alive: the parameters move in place as on CUDA, once. Moved back, they are
    # tagged input until their optimizer steps; at most params + grads + Adam + the batch.
    # Before: the graph kept the old device copies too (3.57 MB here against 3.21 MB).
    state = sum(est.breakdown.get(k, 0) for k in ("parameter", "gradient", "input", "optimizer_state"))
    assert state <= 4 * params + batch, (est.breakdown, params)
    assert state >= 3 * params + batch
