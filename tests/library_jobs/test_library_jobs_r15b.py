"""Round 15b: well-known non-Hugging-Face training scripts, re-created in their repositories'
structure and run unmodified through the capture; device bytes worked out by hand (not read
from peakmem):

- vwxyzjn/cleanrl cleanrl/sac_continuous_action.py (scripts/r15b_cleanrl_sac_continuous.py):
  Pendulum-v1, a squashed-Gaussian actor (`Normal.rsample`, registered `action_scale` /
  `action_bias` buffers), two soft Q networks and their `load_state_dict` targets, three Adams
  (one over a bare `log_alpha` leaf for entropy autotuning), Polyak updates via `.data.copy_`.
- vwxyzjn/cleanrl cleanrl/td3_continuous_action.py (scripts/r15b_cleanrl_td3_continuous.py):
  a deterministic actor with a target actor, exploration noise `torch.normal(0, buffer * c)`,
  target policy smoothing with `randn_like(..., device=device)`, delayed actor updates, and
  `--save-model` writing the three state_dicts as one tuple.
- vwxyzjn/cleanrl cleanrl/c51.py (scripts/r15b_cleanrl_c51.py): a categorical DQN on
  CartPole-v1, a `torch.linspace` atoms buffer, `pmfs[torch.arange(n), action]`, the target
  projected by a per-row `index_add_` loop, `--save-model` of a dict with `vars(args)`.
- eriklindernoren/PyTorch-GAN implementations/gan/gan.py (scripts/r15b_pytorch_gan_gan.py):
  run from its own folder with MNIST under "../../data/mnist", `.cuda()` on the models and the
  loss, the legacy `torch.cuda.FloatTensor` type as a constructor (sizes; a float64 numpy
  array) and as a cast (`imgs.type(Tensor)`), `Variable`, 200 epochs, `save_image`.
- eriklindernoren/PyTorch-GAN implementations/cgan/cgan.py (scripts/r15b_pytorch_gan_cgan.py):
  labels through `nn.Embedding`, `torch.cuda.LongTensor` from numpy int64 arrays and as a cast,
  Dropout, MSELoss, a 10 x 10 sample grid generated with gradients enabled.
- eriklindernoren/PyTorch-GAN implementations/dcgan/dcgan.py (scripts/r15b_pytorch_gan_dcgan.py):
  `weights_init_normal` by `Module.apply`, Upsample + Conv2d blocks, BatchNorm2d(c, 0.8),
  strided convs with Dropout2d.
- eriklindernoren/PyTorch-GAN implementations/infogan/infogan.py (scripts/
  r15b_pytorch_gan_infogan.py): a third Adam over `itertools.chain` of both networks, numpy
  one-hot codes, three discriminator heads, three sample grids generated with gradients on.
- eriklindernoren/PyTorch-GAN implementations/sgan/sgan.py (scripts/r15b_pytorch_gan_sgan.py):
  `LongTensor(batch_size).fill_(num_classes)`, an accuracy through `.data.cpu().numpy()`, and a
  generator Embedding its forward never uses.
- eriklindernoren/PyTorch-GAN implementations/wgan/wgan.py (scripts/r15b_pytorch_gan_wgan.py):
  RMSprop, the critic's weights clipped by `p.data.clamp_` after each step, the generator
  trained every `n_critic` batches.

Both worked as they are (no capture change).
"""

from __future__ import annotations

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import JobEstimate, estimate, estimate_here, write_mnist
from tests.library_jobs.test_library_jobs import assert_training, needs

pytestmark = pytest.mark.slow
MiB = 2**20

PENDULUM = dict(obs_dim=3, act_dim=1)
"""Pendulum-v1: a 3-float observation, one continuous action in [-2, 2]."""

HIDDEN = 256
POLYAK_TEMPS = 3 * ex.rounded(HIDDEN * HIDDEN * ex.FP32)
"""`tau * p.data + (1 - tau) * t.data` on the (256, 256) fc2 weight: both products and their
sum are live together before `copy_` (nothing else is made after the optimizer step)."""

RL_ARGS = ("--env-id", "Pendulum-v1", "--learning-starts", "100", "--batch-size", "32",
           "--buffer-size", "200")


def _notes(est: JobEstimate) -> str:
    return "\n".join(est.data.get("notes", []))


def q_network_shapes(obs_dim: int, act_dim: int) -> list[ex.Shape]:
    """cleanrl's (Soft)QNetwork: Linear(obs + act, 256), Linear(256, 256), Linear(256, 1)."""
    return ex.linear(HIDDEN, obs_dim + act_dim) + ex.linear(HIDDEN, HIDDEN) + ex.linear(1, HIDDEN)


def actor_shapes(obs_dim: int, act_dim: int, heads: int) -> list[ex.Shape]:
    """cleanrl's continuous Actor: Linear(obs, 256), Linear(256, 256) and `heads` heads of
    Linear(256, act) (SAC: mean and log-std; TD3: mu)."""
    return (ex.linear(HIDDEN, obs_dim) + ex.linear(HIDDEN, HIDDEN)
            + heads * ex.linear(act_dim, HIDDEN))


# cleanrl sac_continuous_action.py -----------------------------------------------------------------

@needs("gymnasium", "tyro", "tensorboard", "stable_baselines3")
def test_cleanrl_sac_continuous_two_q_targets_and_log_alpha(tmp_path):
    actor = ex.device_bytes(actor_shapes(**PENDULUM, heads=2), ex.FP32)
    q_net = ex.device_bytes(q_network_shapes(**PENDULUM), ex.FP32)
    log_alpha = ex.BLOCK  # torch.zeros(1, requires_grad=True, device=device): its own Adam
    trained = actor + 2 * q_net + log_alpha
    # in this process (cleanrl's child path: the TD3 test below)
    est = estimate_here("r15b_cleanrl_sac_continuous.py", *RL_ARGS, "--total-timesteps", "120",
                        flags=("--gpu", "h100-80gb"), cwd=tmp_path)
    assert_training(est, params=trained, optimizer_state=2 * trained,
                    extra_lower=2 * q_net + POLYAK_TEMPS)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # the two targets: copies of qf1 / qf2 never trained, moved by the Polyak updates
    assert est.breakdown["ema"] == 2 * q_net
    assert est.breakdown["gradient"] == trained
    assert est.breakdown["buffer"] == 2 * ex.BLOCK  # action_scale and action_bias, (1,) each
    # the peak is the Polyak update of fc2 after the q step: gradients are still held
    assert est.breakdown["other"] == POLYAK_TEMPS
    # global steps 101.. train; the capture's default limit ends the loop (no DataLoader) after
    # a few steps (capture/loop_ends.py), and the job closes its environments and writer
    assert est.data["steps"] >= 3
    assert "training loop(s) without a DataLoader" in _notes(est), _notes(est)
    assert list((tmp_path / "runs").glob("Pendulum-v1__r15b_cleanrl_sac_continuous__1__*/events.*"))


# cleanrl td3_continuous_action.py -----------------------------------------------------------------

@needs("gymnasium", "tyro", "tensorboard", "stable_baselines3")
def test_cleanrl_td3_continuous_target_actor_and_saved_tuple(tmp_path):
    actor = ex.device_bytes(actor_shapes(**PENDULUM, heads=1), ex.FP32)
    q_net = ex.device_bytes(q_network_shapes(**PENDULUM), ex.FP32)
    trained = actor + 2 * q_net
    est = estimate("r15b_cleanrl_td3_continuous.py", *RL_ARGS, "--total-timesteps", "110",
                   "--save-model", flags=("--gpu", "h100-80gb", "--steps", "all"), cwd=tmp_path)
    assert_training(est, params=trained, optimizer_state=2 * trained,
                    extra_lower=trained + POLYAK_TEMPS)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # targets of the actor and both Q networks (load_state_dict copies, Polyak-updated)
    assert est.breakdown["ema"] == trained
    assert est.breakdown["gradient"] == trained
    assert est.breakdown["buffer"] == 4 * ex.BLOCK  # scale and bias of actor and target_actor
    assert est.breakdown["other"] == POLYAK_TEMPS
    # the q optimizer stepped at global steps 101..109; the actor at the even ones
    assert est.data["steps"] == 9
    assert "model saved to runs/Pendulum-v1__r15b_cleanrl_td3_continuous__1__" in est.stderr
    # the state_dict tuple held fake device data: written aside, not as the job's file
    assert "r15b_cleanrl_td3_continuous.cleanrl_model" in _notes(est)


# cleanrl c51.py -----------------------------------------------------------------------------------

@needs("gymnasium", "tyro", "tensorboard", "stable_baselines3")
def test_cleanrl_c51_projection_loop_and_saved_dict(tmp_path):
    atoms, actions = 101, 2  # CartPole-v1: 4 observations, 2 actions
    shapes = ex.linear(120, 4) + ex.linear(84, 120) + ex.linear(actions * atoms, 84)
    q_net = ex.device_bytes(shapes, ex.FP32)
    est = estimate_here("r15b_cleanrl_c51.py", "--total-timesteps", "200", "--learning-starts",
                        "100", "--train-frequency", "20", "--target-network-frequency", "50",
                        "--batch-size", "32", "--buffer-size", "500", "--save-model",
                        flags=("--gpu", "h100-80gb", "--steps", "all"), cwd=tmp_path)
    assert_training(est, params=q_net, optimizer_state=2 * q_net, extra_lower=2 * q_net)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["steps"] == 4  # global steps 120, 140, 160 and 180 train
    assert est.breakdown["ema"] == q_net  # the target network: load_state_dict copies only
    # the atoms (101 fp32) of both networks
    assert est.breakdown["buffer"] == 2 * ex.rounded(atoms * ex.FP32)
    # the peak is Adam's step: foreach Adam's sqrt of the second moments, one per parameter
    assert est.breakdown["temporary"] == q_net
    assert "model saved to runs/CartPole-v1__r15b_cleanrl_c51__1__" in est.stderr
    assert "r15b_cleanrl_c51.cleanrl_model" in _notes(est)

# PyTorch-GAN implementations/gan/gan.py -----------------------------------------------------------

def vanilla_gan_shapes(latent: int = 100, pixels: int = 784) -> tuple[list, list, list]:
    """gan.py's Generator (Linear blocks 128-256-512-1024, BatchNorm1d on all but the first)
    and Discriminator (784-512-256-1); the BatchNorms' running mean, var and
    num_batches_tracked (int64, one element)."""
    generator = (ex.linear(128, latent) + ex.linear(256, 128) + ex.norm(256)
                 + ex.linear(512, 256) + ex.norm(512) + ex.linear(1024, 512) + ex.norm(1024)
                 + ex.linear(pixels, 1024))
    discriminator = ex.linear(512, pixels) + ex.linear(256, 512) + ex.linear(1, 256)
    buffers = [shape for c in (256, 512, 1024) for shape in ((c,), (c,))]
    return generator, discriminator, buffers


@needs("torchvision")
def test_pytorch_gan_legacy_cuda_float_tensor_constructors(tmp_path):
    write_mnist(tmp_path / "data" / "mnist" / "MNIST" / "raw", train=256, test=16)
    folder = tmp_path / "implementations" / "gan"
    folder.mkdir(parents=True)
    generator, discriminator, buffers = vanilla_gan_shapes()
    params = ex.device_bytes(generator + discriminator, ex.FP32)
    batch = 64
    est = estimate_here("r15b_pytorch_gan_gan.py", "--batch_size", str(batch),
                        "--sample_interval", "2", flags=("--gpu", "h100-80gb"), cwd=folder)
    # both Adams step each batch: two moments per parameter
    assert_training(est, params=params, optimizer_state=2 * params)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.breakdown["buffer"] == ex.device_bytes(buffers, ex.FP32) + 3 * ex.BLOCK
    # the batch on the device: `imgs.type(Tensor)` (64 x 1 x 28 x 28 fp32) and z, made by
    # `Tensor(np.random.normal(0, 1, (64, 100)))` (float64 numpy to a float32 device tensor)
    assert est.breakdown["input"] == (ex.rounded(batch * 784 * ex.FP32)
                                      + ex.rounded(batch * 100 * ex.FP32))
    # 4 batches an epoch: the first epoch whole, then the loop is cut short
    assert "[Epoch 0/200] [Batch 3/4]" in est.stderr
    assert "training loop early" in _notes(est)
    assert est.data["steps"] >= 4
    # save_image of the fake gen_imgs every 2 batches, into the job's images/
    assert (folder / "images" / "0.png").exists() and (folder / "images" / "2.png").exists()


@needs("torchvision")
def test_pytorch_gan_cgan_long_tensor_labels_and_embeddings(tmp_path):
    write_mnist(tmp_path / "data" / "mnist" / "MNIST" / "raw", train=256, test=16)
    folder = tmp_path / "implementations" / "cgan"
    folder.mkdir(parents=True)
    classes, latent, pixels, batch = 10, 100, 32 * 32, 64
    embedding = [(classes, classes)]
    generator, _, buffers = vanilla_gan_shapes(latent=latent + classes, pixels=pixels)
    discriminator = (ex.linear(512, pixels + classes) + ex.linear(512, 512) + ex.linear(512, 512)
                     + ex.linear(1, 512))
    params = ex.device_bytes(embedding + generator + embedding + discriminator, ex.FP32)
    est = estimate_here("r15b_pytorch_gan_cgan.py", "--batch_size", str(batch),
                        "--sample_interval", "2", flags=("--gpu", "h100-80gb"), cwd=folder)
    assert_training(est, params=params, optimizer_state=2 * params)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.breakdown["buffer"] == ex.device_bytes(buffers, ex.FP32) + 3 * ex.BLOCK
    # the batch: images (fp32, 32 x 32 after Resize) and labels cast to int64, z and the
    # generator's labels from numpy (float64 -> float32; int64)
    assert est.breakdown["input"] == (ex.rounded(batch * pixels * ex.FP32)
                                      + 2 * ex.rounded(batch * 8)
                                      + ex.rounded(batch * latent * ex.FP32))
    assert "[Epoch 0/200] [Batch 3/4]" in est.stderr
    assert est.data["steps"] >= 4
    assert (folder / "images" / "0.png").exists()


def _dcgan_generator(inputs: int) -> list[ex.Shape]:
    """PyTorch-GAN's DCGAN-style generator at 32 x 32: Linear to 128 x 8 x 8, BatchNorm2d,
    two Upsample + Conv2d + BatchNorm2d blocks, a Conv2d to one channel."""
    return (ex.linear(128 * 8 * 8, inputs) + ex.norm(128) + ex.conv(128, 128, 3) + ex.norm(128)
            + ex.conv(64, 128, 3) + ex.norm(64) + ex.conv(1, 64, 3))


def _dcgan_discriminator_body() -> list[ex.Shape]:
    return (ex.conv(16, 1, 3) + ex.conv(32, 16, 3) + ex.norm(32) + ex.conv(64, 32, 3)
            + ex.norm(64) + ex.conv(128, 64, 3) + ex.norm(128))


@needs("torchvision")
def test_pytorch_gan_dcgan_upsample_conv_generator(tmp_path):
    write_mnist(tmp_path / "data" / "mnist" / "MNIST" / "raw", train=256, test=16)
    folder = tmp_path / "implementations" / "dcgan"
    folder.mkdir(parents=True)
    batch = 64
    generator = _dcgan_generator(100)
    discriminator = _dcgan_discriminator_body() + ex.linear(1, 128 * 2 * 2)
    norms = (128, 128, 64, 32, 64, 128)  # running mean and var (fp32), num_batches_tracked
    params = ex.device_bytes(generator + discriminator, ex.FP32)
    est = estimate_here("r15b_pytorch_gan_dcgan.py", "--batch_size", str(batch),
                        "--sample_interval", "2", flags=("--gpu", "h100-80gb"), cwd=folder)
    # cuDNN's convolution workspaces come on top of the tiny model's state
    assert_training(est, params=params, optimizer_state=2 * params,
                    extra_upper=est.breakdown["workspace"])
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.breakdown["buffer"] == (ex.device_bytes([(c,) for c in norms for _ in "mv"],
                                                       ex.FP32) + len(norms) * ex.BLOCK)
    # the generator's 128 x 32 x 32 upsampled maps of 64 images (32 MiB) are saved for the
    # backward; all its forward outputs together stay under 128 MiB
    assert 32 * MiB <= est.breakdown["activation"] <= 128 * MiB
    assert est.breakdown["input"] == (ex.rounded(batch * 32 * 32 * ex.FP32)
                                      + ex.rounded(batch * 100 * ex.FP32))
    assert "[Epoch 0/200] [Batch 3/4]" in est.stderr
    assert (folder / "images" / "0.png").exists()


@needs("torchvision")
def test_pytorch_gan_infogan_chained_adam_and_sample_graphs(tmp_path):
    write_mnist(tmp_path / "data" / "mnist" / "MNIST" / "raw", train=256, test=16)
    folder = tmp_path / "implementations" / "infogan"
    folder.mkdir(parents=True)
    latent, classes, code = 62, 10, 2
    generator = ex.device_bytes(_dcgan_generator(latent + classes + code), ex.FP32)
    adv, aux, lat = (ex.device_bytes(ex.linear(n, 512), ex.FP32) for n in (1, classes, code))
    discriminator = ex.device_bytes(_dcgan_discriminator_body(), ex.FP32) + adv + aux + lat
    params = generator + discriminator
    # Adam keeps moments only for parameters that had a gradient when it stepped: optimizer_D
    # never sees aux / latent heads' gradients (its zero_grad drops the info step's), and
    # optimizer_info (both networks, chained) never sees adv_layer's
    optimizer = 2 * generator + 2 * (discriminator - aux - lat) + 2 * (params - adv)
    est = estimate_here("r15b_pytorch_gan_infogan.py", "--batch_size", "64",
                        "--sample_interval", "2", flags=("--gpu", "h100-80gb"), cwd=folder)
    assert_training(est, params=params, optimizer_state=optimizer,
                    extra_upper=est.breakdown["workspace"] + est.breakdown["temporary"])
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # the info step's zero_grad dropped adv_layer's gradient; its backward never reached it
    assert est.breakdown["gradient"] == params - adv
    # the peak is sample_image: three 100-image generator graphs kept (static_sample, sample1,
    # sample2 are locals; no no_grad), each holding a 128 x 32 x 32 upsampled map per image,
    # never backpropagated: temporaries; each graph's saved outputs are ~152 MB
    upsampled = ex.rounded(100 * 128 * 32 * 32 * ex.FP32)
    assert 3 * upsampled <= est.breakdown["temporary"] <= 3 * 160 * MiB
    for grid in ("static", "varying_c1", "varying_c2"):
        assert (folder / "images" / grid / "0.png").exists()


@needs("torchvision")
def test_pytorch_gan_sgan_unused_embedding_has_no_adam_state(tmp_path):
    write_mnist(tmp_path / "data" / "mnist" / "MNIST" / "raw", train=256, test=16)
    folder = tmp_path / "implementations" / "sgan"
    folder.mkdir(parents=True)
    classes, latent, batch = 10, 100, 64
    label_emb = ex.device_bytes([(classes, latent)], ex.FP32)
    generator = ex.device_bytes(_dcgan_generator(latent), ex.FP32) + label_emb
    discriminator = ex.device_bytes(_dcgan_discriminator_body() + ex.linear(1, 512)
                                    + ex.linear(classes + 1, 512), ex.FP32)
    params = generator + discriminator
    est = estimate_here("r15b_pytorch_gan_sgan.py", "--batch_size", str(batch),
                        "--sample_interval", "2", flags=("--gpu", "h100-80gb"), cwd=folder)
    # label_emb never gets a gradient: Adam keeps no moments for it
    assert_training(est, params=params, optimizer_state=2 * (params - label_emb),
                    extra_upper=est.breakdown["workspace"])
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # the batch: images, their int64 labels and z (fake_aux_gt, (64,) int64, is made on the
    # device by `LongTensor(64).fill_`, as valid / fake are)
    assert est.breakdown["input"] == (ex.rounded(batch * 32 * 32 * ex.FP32) + ex.rounded(batch * 8)
                                      + ex.rounded(batch * latent * ex.FP32))
    # the accuracy read the device predictions back each batch
    assert "[Epoch 0/200] [Batch 3/4] [D loss: 0.000000, acc:" in est.stderr
    assert (folder / "images" / "0.png").exists()


@needs("torchvision")
def test_pytorch_gan_wgan_rmsprop_and_weight_clipping(tmp_path):
    write_mnist(tmp_path / "data" / "mnist" / "MNIST" / "raw", train=256, test=16)
    folder = tmp_path / "implementations" / "wgan"
    folder.mkdir(parents=True)
    generator, discriminator, _ = vanilla_gan_shapes()  # the critic: gan.py's, no Sigmoid
    params = ex.device_bytes(generator + discriminator, ex.FP32)
    batch = 32
    est = estimate_here("r15b_pytorch_gan_wgan.py", "--batch_size", str(batch), "--n_critic", "2",
                        "--sample_interval", "4", flags=("--gpu", "h100-80gb"), cwd=folder)
    # RMSprop (no momentum, not centered): one square_avg per parameter
    assert_training(est, params=params, optimizer_state=params)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.breakdown["input"] == (ex.rounded(batch * 784 * ex.FP32)
                                      + ex.rounded(batch * 100 * ex.FP32))
    # 8 batches an epoch, shortened by the capture to 3 and the last (len() says 4); the
    # generator steps at i = 0 and 2 of each: critic steps outnumber the generator's
    assert "[Epoch 0/200] [Batch 2/4]" in est.stderr
    assert "[Epoch 0/200] [Batch 1/4]" not in est.stderr
    assert est.data["steps"] >= 4
    assert (folder / "images" / "0.png").exists() and (folder / "images" / "4.png").exists()
