"""Round 14: well-known repositories' training scripts, re-created from their own source and
run unmodified through the capture; device bytes worked out by hand (not read from peakmem):

- pytorch/tutorials beginner_source/transfer_learning_tutorial.py (scripts/
  r14_transfer_learning_tutorial.py): hymenoptera_data through ImageFolder, resnet18 with its
  ImageNet weights from the torch.hub cache (TORCH_HOME), fine-tuned whole, then a second one
  frozen but for `fc`, each through 25 epochs of train/val with the best weights saved to a
  TemporaryDirectory and loaded back.
- Lightning-AI/pytorch-lightning examples/pytorch/domain_templates/generative_adversarial_net.py
  (scripts/r14_lightning_gan.py): manual optimization with two Adams, `toggle_optimizer`,
  Lightning's own MNISTDataModule, `Trainer(accelerator="gpu", devices=1)` with no epoch limit.
- pytorch/tutorials intermediate_source/spatial_transformer_tutorial.py (scripts/
  r14_spatial_transformer_tutorial.py): `F.affine_grid` / `F.grid_sample` in the forward.
- pytorch/tutorials intermediate_source/char_rnn_classification_tutorial.py (scripts/
  r14_char_rnn_classification_tutorial.py): `torch.set_default_device("cuda")`, then the
  dataset's tensors printed. It failed before (capture/device_map.py, device_view.py, eager.py:
  the capture's host copies were made on the job's default device; tests/capture/
  test_default_device_build.py).
- pytorch/tutorials intermediate_source/reinforcement_q_learning.py (scripts/
  r14_reinforcement_q_learning.py): a DQN on gymnasium's CartPole, AdamW(amsgrad), a target net
  soft-updated through its state_dict.
- pytorch/tutorials beginner_source/basics/quickstart_tutorial.py (scripts/
  r14_quickstart_tutorial.py): FashionMNIST, `torch.accelerator`, the model saved and loaded
  back into a new model while the optimizer still holds the first.
- pytorch/tutorials beginner_source/introyt/trainingyt.py (scripts/r14_introyt_trainingyt.py):
  FashionMNIST, SummaryWriter, best-vloss saves; the model never leaves the CPU, and the
  estimate says so.
- pytorch/tutorials intermediate_source/per_sample_grads.py (scripts/r14_per_sample_grads.py):
  per-sample gradients by a loop of `autograd.grad` and by `torch.func.vmap(grad(...))`,
  compared with `allclose`, each timed by `torch.utils.benchmark.Timer.timeit(100)`.
- Lightning-AI/pytorch-lightning examples/pytorch/domain_templates/computer_vision_fine_tuning.py
  (scripts/r14_lightning_cv_fine_tuning.py): LightningCLI `fit`, a ResNet-50 backbone frozen, then
  unfrozen at epochs 5 and 10 by a `BaseFinetuning` callback (new Adam parameter groups). The
  job was stopped at epoch 5 before (Lightning did not validate in the epochs the capture ended
  early, so they looked like bare repeats): capture/lightning_val_check.py,
  tests/capture/test_lightning_val_check.py.
- pytorch/tutorials beginner_source/dcgan_faces_tutorial.py (scripts/r14_dcgan_faces_tutorial.py):
  `torch.use_deterministic_algorithms(True)` without CUBLAS_WORKSPACE_CONFIG; fine on a GPU
  for a convolution-only model, where a matmul raises (cuda_rules/blas.py, now checked:
  tests/cuda_rules/test_blas.py).
- pytorch/tutorials intermediate_source/optimizer_step_in_backward_tutorial.py (scripts/
  r14_optimizer_step_in_backward_tutorial.py): ViT-L/16 with Adam under
  `_record_memory_history`; the tutorial's own snapshot figures are the check.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import JobEstimate, estimate_here, write_mnist
from tests.library_jobs.test_library_jobs import WORKSPACE_SLACK, assert_training, needs

pytestmark = pytest.mark.slow
MiB = 2**20


def _notes(est: JobEstimate) -> str:
    return "\n".join(est.data.get("notes", []))



def _torchvision():
    """torchvision importable here (its compiled ops declared, as the capture does)."""
    from peakmem.capture.vision_ops import declare_torchvision_ops

    declare_torchvision_ops()
    import torchvision

    return torchvision


def _hub_weights(torch_home: Path, arch: str, url_name: str) -> None:
    """A torchvision architecture's weights file in the torch.hub cache, as a download leaves
    it (`$TORCH_HOME/hub/checkpoints/<name from the URL>`): zeros of the right shapes."""
    import torch

    with torch.device("meta"):
        model = getattr(_torchvision().models, arch)()
    folder = torch_home / "hub" / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({k: torch.zeros(v.shape, dtype=v.dtype) for k, v in model.state_dict().items()},
               folder / url_name)


# pytorch/tutorials transfer_learning_tutorial.py ------------------------------------------------

@pytest.fixture(scope="module")
def transfer_learning(tmp_path_factory) -> JobEstimate:
    import numpy as np
    from PIL import Image

    workdir = tmp_path_factory.mktemp("r14-transfer")
    rng = np.random.default_rng(0)
    root = workdir / "data" / "hymenoptera_data"
    # 8 training images: 2 batches of 4 an epoch; 3 validation images (the tutorial's last
    # prediction reads val/bees/72100438_73de9f17af.jpg): 1 batch
    for split, names in (("train", {"ants": 4, "bees": 4}), ("val", {"ants": 1, "bees": 1})):
        for cls, n in names.items():
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 255, (240, 260, 3), dtype=np.uint8)).save(
                    root / split / cls / f"{i}.jpg")
    Image.fromarray(rng.integers(0, 255, (240, 260, 3), dtype=np.uint8)).save(
        root / "val" / "bees" / "72100438_73de9f17af.jpg")
    _hub_weights(workdir / "torch_home", "resnet18", "resnet18-f37072fd.pth")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_HOME", str(workdir / "torch_home"))
        patch.setenv("MPLBACKEND", "Agg")
        return estimate_here("r14_transfer_learning_tutorial.py", cwd=workdir,
                             flags=("--gpu", "h100-80gb"), timeout=600)


@needs("torchvision", "matplotlib")
def test_transfer_learning_both_models_trained(transfer_learning):
    est = transfer_learning
    params, _ = ex.resnet18_shapes(2)
    model = ex.device_bytes(params, ex.FP32)
    fc = ex.device_bytes(ex.linear(2, 512), ex.FP32)
    # the fine-tuned model's SGD momentum: one buffer per parameter; at the peak (its training)
    # the fixed-feature model does not exist yet
    assert_training(est, params=model, optimizer_state=model)
    assert est.data["mode"] == "fake"
    # both `train_model` calls ran: 25 epochs each (the later ones their last batch only), and
    # the fixed-feature extractor's SGD stepped its `fc` alone
    assert est.stderr.count("Epoch 24/24") == 2
    assert est.stderr.count("Best val Acc") == 2
    assert "training loop ended early" in _notes(est)
    assert est.data["steps"] >= 25  # the most-stepped optimizer's steps: one a later epoch
    # each run's best weights were saved to its TemporaryDirectory (diverted: fake device data)
    assert "best_model_params.pt" in _notes(est)
    assert fc < model


# Lightning generative_adversarial_net.py ---------------------------------------------------------

def _gan_shapes() -> tuple[list, list]:
    generator = (ex.linear(128, 100) + ex.linear(256, 128) + ex.norm(256) + ex.linear(512, 256)
                 + ex.norm(512) + ex.linear(1024, 512) + ex.norm(1024) + ex.linear(784, 1024))
    discriminator = ex.linear(512, 784) + ex.linear(256, 512) + ex.linear(1, 256)
    return generator, discriminator


@needs("lightning", "torchvision", "tensorboard")
def test_lightning_gan_manual_optimization_two_adams(tmp_path):
    # MNISTDataModule's default validation split is 5000 images: 5200 leave 6 training batches
    write_mnist(tmp_path / "data" / "MNIST" / "raw", train=5200, test=64)
    est = estimate_here("r14_lightning_gan.py", cwd=tmp_path, flags=("--gpu", "h100-80gb"),
                        timeout=300)
    generator, discriminator = _gan_shapes()
    params = ex.device_bytes(generator + discriminator, ex.FP32)
    # each Adam keeps two moments of its own network's parameters
    assert_training(est, params=params, optimizer_state=2 * params)
    # no epoch limit (max_epochs=-1 means 1000 in Lightning): ended by the capture, with the
    # epoch-end image grid logged to TensorBoard each epoch
    assert "stopped after" in _notes(est) or "training loop ended early" in _notes(est)
    assert "epoch=0-step=8.ckpt" in _notes(est)  # 4 batches x 2 optimizer steps in epoch 0
    assert list(tmp_path.glob("lightning_logs/version_0/events.out.tfevents.*"))


# spatial_transformer_tutorial.py ----------------------------------------------------------------

def _stn_shapes() -> list:
    return (ex.conv(10, 1, 5) + ex.conv(20, 10, 5) + ex.linear(50, 320) + ex.linear(10, 50)
            + ex.conv(8, 1, 7) + ex.conv(10, 8, 5) + ex.linear(32, 90) + ex.linear(6, 32))


@needs("torchvision", "matplotlib")
def test_spatial_transformer_grid_sample_training(tmp_path, monkeypatch):
    write_mnist(tmp_path / "MNIST" / "raw", train=640, test=128)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    est = estimate_here("r14_spatial_transformer_tutorial.py", cwd=tmp_path,
                        flags=("--gpu", "h100-80gb"), timeout=300)
    params = ex.device_bytes(_stn_shapes(), ex.FP32)
    assert_training(est, params=params, optimizer_state=0)  # plain SGD: no state
    # 64 x 1 x 28 x 28 inputs: the sampling grid (64 x 28 x 28 x 2 fp32) and the sampled images
    # are activations of a few hundred KiB each; the peak is the model, its gradients, the
    # cuBLAS / cuDNN workspaces and those activations
    assert est.breakdown.get("activation", 0) >= 64 * 28 * 28 * 2 * 4
    assert "training loop ended early" in _notes(est)
    assert est.stderr.count("Test set: Average loss") == 20
    assert est.data["peak_allocated_bytes"] <= 2 * params + 64 * MiB + WORKSPACE_SLACK


# char_rnn_classification_tutorial.py: set_default_device("cuda") ------------------------------

@needs("matplotlib")
def test_char_rnn_classification_default_device_dataset(tmp_path, monkeypatch):
    rng = random.Random(0)
    names = tmp_path / "data" / "names"
    names.mkdir(parents=True)
    for language in ("Italian", "Polish", "Japanese"):
        (names / f"{language}.txt").write_text("\n".join(
            "".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(3, 9))).title()
            for _ in range(50)))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    est = estimate_here("r14_char_rnn_classification_tutorial.py", cwd=tmp_path,
                        flags=("--gpu", "h100-80gb"), timeout=300)
    assert est.returncode == 0, est.failure()
    n_letters, hidden, classes = 58, 128, 3
    rnn = [(hidden, n_letters), (hidden, hidden), (hidden,), (hidden,)] + ex.linear(classes, hidden)
    params = ex.device_bytes(rnn, ex.FP32)
    assert est.breakdown.get("parameter") == params
    assert est.data["estimate_kind"] == "training" and est.data["steps"] == 3
    # the dataset printed its first item (tensors on the default device), and was split with a
    # device Generator: 150 names, 85 % for training
    assert "Using device = cuda:0" in est.stderr
    assert "device='cuda:0'), 'Italian'" in est.stderr or "device='cuda:0'), 'Polish'" in est.stderr \
        or "device='cuda:0'), 'Japanese'" in est.stderr
    assert "train examples = 128, validation examples = 22" in est.stderr
    # the 150 one-hot names (len x 1 x 58 fp32, 3..9 letters: one 512-byte block at most 2
    # blocks each) and their labels live on the device: counted, a few hundred KiB
    data = est.data["peak_allocated_bytes"] - est.breakdown.get("workspace", 0)
    assert params + 150 * 2 * ex.BLOCK <= data <= params * 4 + 2 * MiB


# reinforcement_q_learning.py ---------------------------------------------------------------------

@needs("gymnasium", "matplotlib")
def test_dqn_cartpole_amsgrad_and_target_net(tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    est = estimate_here("r14_reinforcement_q_learning.py", cwd=tmp_path,
                        flags=("--gpu", "h100-80gb"), timeout=300)
    params = ex.device_bytes(ex.linear(128, 4) + ex.linear(128, 128) + ex.linear(2, 128), ex.FP32)
    # AdamW(amsgrad=True): exp_avg, exp_avg_sq and max_exp_avg_sq per parameter
    assert_training(est, params=params, optimizer_state=3 * params,
                    extra_upper=2 * params + 2 * MiB)
    # the target net, soft-updated from the policy net every step, is a second copy
    assert est.breakdown.get("ema") == params
    assert est.data["steps"] == 3


# quickstart_tutorial.py --------------------------------------------------------------------------

@needs("torchvision")
def test_quickstart_reload_while_optimizer_holds_old_model(tmp_path):
    write_mnist(tmp_path / "data" / "FashionMNIST" / "raw", train=640, test=320)
    est = estimate_here("r14_quickstart_tutorial.py", cwd=tmp_path,
                        flags=("--gpu", "h100-80gb"), timeout=300)
    assert est.returncode == 0, est.failure()
    params = ex.device_bytes(ex.linear(512, 784) + ex.linear(512, 512) + ex.linear(10, 512),
                             ex.FP32)
    # the peak is the reload: the trained model (still held by the global SGD), the new model
    # and the state dict loaded onto the device (`torch.save` of device tensors loads there)
    assert est.breakdown.get("parameter") == 2 * params
    assert est.breakdown.get("temporary", 0) >= params
    assert "the peak was set by the evaluation after training" in _notes(est)
    assert 'Predicted: "' in est.stderr
    assert est.data["peak_allocated_bytes"] <= 3 * params + est.breakdown["workspace"] + MiB


# introyt/trainingyt.py: a tutorial that never uses the GPU -------------------------------------

@needs("torchvision", "tensorboard")
def test_trainingyt_cpu_only_job_is_said_so(tmp_path):
    write_mnist(tmp_path / "data" / "FashionMNIST" / "raw", train=40, test=20)
    est = estimate_here("r14_introyt_trainingyt.py", cwd=tmp_path, flags=("--gpu", "h100-80gb"),
                        timeout=300)
    assert est.returncode == 0, est.failure()
    # the model and batches stay on the host: no device bytes, the CUDA context alone, and a
    # warning that says why
    assert est.data["estimate_kind"] == "training" and est.data["steps"] >= 5
    assert est.data["peak_allocated_bytes"] == 0 and est.breakdown == {}
    assert "WARNING: the job made no device allocations: it never used the GPU" in _notes(est)
    assert est.data["peak_bytes"] >= est.data["context_bytes"] > 0
    assert est.stderr.count("LOSS train") == 5  # every epoch's validation ran
    assert list(tmp_path.glob("runs/fashion_trainer_*/events.out.tfevents.*"))


# per_sample_grads.py: torch.func vmap(grad) against a loop of autograd.grad -----------------

def test_per_sample_grads_loop_vmap_and_timer():
    # 2 timed runs of each statement instead of the tutorial's 100 (the Timer adds 2 warm-up
    # runs): every run repeats the first, and the peak is in one (about 25x fewer captured ops)
    est = estimate_here("r14_per_sample_grads.py", "--number", "2", flags=("--gpu", "h100-80gb"),
                        timeout=600)
    assert est.returncode == 0, est.failure()
    shapes = ex.conv(32, 1, 3) + ex.conv(64, 32, 3) + ex.linear(128, 9216) + ex.linear(10, 128)
    params = ex.device_bytes(shapes, ex.FP32)
    stacked = ex.device_bytes([(64, *shape) for shape in shapes], ex.FP32)  # one set, stacked
    unstacked = 64 * params  # 64 tuples of `autograd.grad` results, before `torch.stack`
    inputs = ex.rounded(64 * 28 * 28 * 4) + ex.rounded(64 * 8)
    assert est.breakdown["parameter"] == params
    assert est.breakdown["gradient"] == params  # the mini-batch's `loss.backward()`
    # the peak is in the Timer's loop run: the loop's and vmap's per-sample gradients (kept by
    # the script's globals) and the batch, while the timed call holds its 64 tuples and stacks
    # them
    assert est.breakdown["other"] == 2 * stacked + inputs
    assert est.breakdown["temporary"] == stacked + unstacked
    assert est.data["estimate_kind"] == "training" and est.data["steps"] == 0
    assert "training (no parameter update seen)" in _notes(est)
    assert "improvement with vmap" in est.stderr  # both timings ran


# Lightning computer_vision_fine_tuning.py: unfreezing at epoch milestones ----------------------

@needs("lightning", "torchvision", "jsonargparse")
def test_lightning_cv_fine_tuning_reaches_the_full_unfreeze(tmp_path, monkeypatch):
    import io
    import zipfile

    import numpy as np
    import torch
    from PIL import Image

    rng = np.random.default_rng(0)
    (tmp_path / "data").mkdir()
    # the archive `prepare_data` fetches, already downloaded (it is extracted, then removed):
    # 16 training images (2 batches of 8 an epoch) and 4 validation images
    with zipfile.ZipFile(tmp_path / "data" / "cats_and_dogs_filtered.zip", "w") as archive:
        for split, count in (("train", 8), ("validation", 2)):
            for label in ("cats", "dogs"):
                for i in range(count):
                    image = io.BytesIO()
                    Image.fromarray(rng.integers(0, 255, (60, 50, 3), dtype=np.uint8)).save(image, "JPEG")
                    archive.writestr(f"cats_and_dogs_filtered/{split}/{label}/{label}.{i}.jpg",
                                     image.getvalue())
    _hub_weights(tmp_path / "torch_home", "resnet50", "resnet50-11ad3fa6.pth")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    est = estimate_here("r14_lightning_cv_fine_tuning.py", "fit", cwd=tmp_path,
                        flags=("--gpu", "h100-80gb"), timeout=600)
    assert est.returncode == 0, est.failure()
    with torch.device("meta"):
        backbone = _torchvision().models.resnet50()
    convs = [tuple(p.shape) for m in backbone.modules() if isinstance(m, torch.nn.Conv2d)
             for p in m.parameters()]
    norms = [tuple(p.shape) for m in backbone.modules() if isinstance(m, torch.nn.BatchNorm2d)
             for p in m.parameters()]
    head = ex.linear(256, 2048) + ex.linear(32, 256) + ex.linear(1, 32)
    assert est.breakdown["parameter"] == ex.device_bytes(convs + norms + head, ex.FP32)
    # at epoch 10 the callback adds the rest of the backbone to Adam (BatchNorm left out:
    # `train_bn=False`): two moments of every convolution and of the head. Before the fix the
    # job was stopped at epoch 5 with the head's moments alone
    assert est.breakdown["optimizer_state"] == 2 * ex.device_bytes(convs + head, ex.FP32)
    assert "Epoch 14/14" in est.stderr
    # a batch of 8 images at 224 x 224 through the whole ResNet-50 with gradients: activations
    # of hundreds of MiB
    assert est.breakdown["activation"] > 300 * MiB


# dcgan_faces_tutorial.py: use_deterministic_algorithms(True) -----------------------------------

@needs("torchvision", "matplotlib")
def test_dcgan_faces_deterministic_convolutions_only(tmp_path, monkeypatch):
    import numpy as np
    from PIL import Image

    folder = tmp_path / "data" / "celeba" / "img_align_celeba"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(300):  # 3 batches of 128 (the last of 44) an epoch
        Image.fromarray(rng.integers(0, 255, (88, 72, 3), dtype=np.uint8)).save(folder / f"{i:06d}.jpg")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    est = estimate_here("r14_dcgan_faces_tutorial.py", cwd=tmp_path,
                        flags=("--gpu", "h100-80gb"), timeout=300)
    params, _ = ex.dcgan_shapes(nz=100, ngf=64, ndf=64)
    model = ex.device_bytes(params, ex.FP32)
    # deterministic algorithms and no CUBLAS_WORKSPACE_CONFIG: fine, as on the GPU, because
    # the DCGAN has convolutions only (no cuBLAS gemm); two Adams, two moments each
    assert_training(est, params=model, optimizer_state=2 * model,
                    extra_upper=est.breakdown.get("activation", 0))
    # 128 x 3 x 64 x 64 fp32 images: the real batch and the fake one are activations of 6 MiB
    assert est.breakdown["activation"] >= 2 * 128 * 3 * 64 * 64 * 4
    assert "[4/5][0/3]" in est.stderr  # the 5 epochs ran (the later ones their last batch)
    import torch
    assert not torch.are_deterministic_algorithms_enabled()  # put back after the job


# optimizer_step_in_backward_tutorial.py: ViT-L/16, the tutorial's own figures -----------------

@needs("torchvision")
def test_optimizer_step_in_backward_first_phase_matches_tutorial(tmp_path, monkeypatch):
    import torch

    _hub_weights(tmp_path / "torch_home", "vit_l_16", "vit_l_16-852ce7e3.pth")  # 1.2 GB
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    est = estimate_here("r14_optimizer_step_in_backward_tutorial.py", cwd=tmp_path,
                        flags=("--gpu", "h100-80gb"), timeout=300)
    (tmp_path / "torch_home" / "hub" / "checkpoints" / "vit_l_16-852ce7e3.pth").unlink()
    with torch.device("meta"):
        shapes = [tuple(p.shape) for p in _torchvision().models.vit_l_16().parameters()]
    params = ex.device_bytes(shapes, ex.FP32)
    assert 1.2e9 < params < 1.25e9  # "~1.2GB of parameters"
    assert est.returncode == 0, est.failure()
    # the tutorial: "the peak memory usage is during the optimizer step ... ~1.2GB of
    # parameters, ~1.2GB of gradients, and ~2.4GB=2*1.2GB of the optimizer state ... The last
    # ~1.2GB comes from Adam optimizer requiring memory for intermediates, totaling to ~6GB"
    assert est.breakdown["parameter"] == params
    assert est.breakdown["optimizer_state"] == 2 * params
    assert params <= est.breakdown["gradient"] <= params + MiB
    assert est.breakdown["temporary"] == params  # foreach Adam's intermediates
    assert 5 * params <= est.data["peak_allocated_bytes"] <= 5 * params + 256 * MiB
    # the third step ends the first loop (it iterates no DataLoader; capture/loop_ends.py):
    # the first phase is the tutorial's peak; the per-parameter Adams stepped in backward come
    # after it, and now run too (each loop gets its own 3 steps), below that peak
    assert est.data["steps"] >= 3
    assert "training loop(s) without a DataLoader at the step limit" in _notes(est)
    assert "_record_memory_history: the snapshot holds the simulated segments" in _notes(est)
