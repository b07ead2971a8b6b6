"""Round 9: training scripts from well-known repositories not covered before (CleanRL, Hydra
configured Lightning, build-nanogpt, ...), each re-created in a tiny script the way the
public source it cites writes it, run unmodified through the real CLI (`python -m peakmem
estimate --json -- python SCRIPT ARGS`, scripts/r9_*.py). Parameter and optimizer bytes are
worked out by hand (expected.py), not read from peakmem."""

from __future__ import annotations

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import estimate, estimate_here
from tests.library_jobs.test_library_jobs import assert_training, needs


def _notes(est) -> str:
    return "\n".join(est.data["notes"])


# vwxyzjn/cleanrl cleanrl/ppo.py on CartPole-v1 (gymnasium, tyro, tensorboard) --------------------

def cleanrl_agent_shapes(obs_dim: int, actions: int, hidden: int = 64) -> list[ex.Shape]:
    """cleanrl's `Agent`: a critic and an actor, each Linear(obs, 64), Linear(64, 64) and a head
    (1 value; one logit per action)."""
    trunk = ex.linear(hidden, obs_dim) + ex.linear(hidden, hidden)
    return trunk + ex.linear(1, hidden) + trunk + ex.linear(actions, hidden)


CARTPOLE = dict(obs_dim=4, actions=2)
"""CartPole-v1: a 4-float observation, two discrete actions."""


@needs("gymnasium", "tyro", "tensorboard")
def test_cleanrl_ppo_cartpole_rollout_buffers_and_adam(tmp_path):
    params = ex.device_bytes(cleanrl_agent_shapes(**CARTPOLE), ex.FP32)
    num_steps, num_envs = 32, 4
    # in this process (cleanrl's child path: the DQN test below)
    est = estimate_here("r9_cleanrl_ppo.py", "--total-timesteps", "256", "--num-steps",
                        str(num_steps), "--num-envs", str(num_envs), cwd=tmp_path)
    # Adam(eps=1e-5), not fused: exp_avg and exp_avg_sq per parameter, `step` on the host
    assert_training(est, params=params, optimizer_state=2 * params)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["phases_ran"] == ["training"]
    # the rollout storage, `torch.zeros(...).to(device)`: obs (steps, envs, 4), then actions,
    # logprobs, rewards, dones and values (steps, envs) each
    storage = ex.device_bytes([(num_steps, num_envs, 4)] + 5 * [(num_steps, num_envs)], ex.FP32)
    assert est.breakdown["input"] >= storage, est.breakdown
    # the actions went to the environments through `action.cpu().numpy()` (host reads)
    assert "host read(s) of device values" in "\n".join(est.data["assumptions"])
    assert list((tmp_path / "runs").glob("CartPole-v1__r9_cleanrl_ppo__1__*/events.out.*"))



@needs("gymnasium", "tyro", "tensorboard", "stable_baselines3")
def test_cleanrl_dqn_replay_buffer_and_target_network(tmp_path):
    # QNetwork: Linear(4, 120), Linear(120, 84), Linear(84, 2); the target network is a second
    # QNetwork (load_state_dict of the first), never trained
    q_net = ex.device_bytes(ex.linear(120, 4) + ex.linear(84, 120) + ex.linear(2, 84), ex.FP32)
    est = estimate("r9_cleanrl_dqn.py", "--total-timesteps", "200", "--learning-starts", "100",
                   "--train-frequency", "20", "--target-network-frequency", "50",
                   "--batch-size", "32", "--buffer-size", "500", flags=("--steps", "all"),
                   cwd=tmp_path)
    assert_training(est, params=2 * q_net, grads=q_net, optimizer_state=2 * q_net)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["steps"] == 4  # global steps 120, 140, 160 and 180 train
    assert est.breakdown["gradient"] == q_net  # no gradient reached the target network


# ashleve/lightning-hydra-template: src/train.py with @hydra.main and command-line overrides -------

def simple_dense_net_shapes(sizes: tuple[int, ...] = (784, 64, 128, 64, 10)) -> tuple[list, list]:
    """The template's SimpleDenseNet (configs/model/mnist.yaml sizes): Linear + BatchNorm1d per
    hidden layer, a Linear head; BatchNorm1d buffers: running mean and var, num_batches_tracked."""
    shapes, buffers = [], []
    for d_in, d_out in zip(sizes[:-2], sizes[1:-1], strict=True):
        shapes += ex.linear(d_out, d_in) + [(d_out,), (d_out,)]
        buffers += [(d_out,), (d_out,), ()]
    return shapes + ex.linear(sizes[-1], sizes[-2]), buffers


@pytest.mark.slow
@needs("hydra", "lightning", "torchmetrics", "omegaconf")
def test_lightning_hydra_template_train_with_overrides(tmp_path):
    shapes, buffers = simple_dense_net_shapes()
    params = ex.device_bytes(shapes, ex.FP32)
    # `test=False`: the template's `trainer.test(ckpt_path=best)` fails on torch >= 2.6 on a GPU
    # too (Lightning loads with weights_only and the checkpoint's hyperparameters hold `net`)
    # in a child process: run in the test's process (fake mode to the end), the job left the
    # pytest worker's capture closed and every later test in that worker failed with "I/O
    # operation on closed file" (fresh-clone CI, 2026-11-27; cause not pinned down: Hydra's
    # logging set-up is the suspect)
    est = estimate("r9_hydra_train.py", "trainer=gpu", "trainer.max_epochs=2",
                   "data.train_val_test_split=[64,32,32]", "data.batch_size=32",
                   "model.optimizer.lr=0.002", "logger=csv", "test=False", cwd=tmp_path)
    # Adam from the `_partial_` optimizer config: exp_avg and exp_avg_sq, host `step`s
    assert_training(est, params=params, optimizer_state=2 * params)
    assert est.breakdown["buffer"] == ex.device_bytes(buffers, ex.FP32)
    # torchmetrics' Accuracy checks `len(torch.unique(target)) <= num_classes` and the same of
    # `preds = argmax(logits, dim=1)`: the labels moved from the host keep their values through
    # `unique`, and argmax's indices hold at most 10 distinct values (capture/known_values.py),
    # so the job runs in fake mode (before: the upper bound, 32 distinct, failed the check and
    # auto mode reran it in eager); EarlyStopping's `torch.isfinite(val/acc)` reads True
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # 2 batches an epoch: both epochs and their validations ran
    assert est.data["phases_ran"] == ["training", "eval", "training", "eval"], est.data["phases_ran"]
    assert est.data["steps"] == 4
    # the bytes eager mode gives for this job (`--mode eager`: peak allocated 69,662,208 B)
    assert est.data["peak_allocated_bytes"] == 69_662_208
    runs = list((tmp_path / "logs" / "train" / "runs").glob("*/.hydra/overrides.yaml"))
    assert runs and "model.optimizer.lr=0.002" in runs[-1].read_text()


# Stable-Baselines3 quickstart: PPO / SAC("MlpPolicy", env, device="cuda").learn(...) ------------

def sac_mlp_shapes(obs_dim: int, act_dim: int, hidden: int = 256, critics: int = 2) -> tuple:
    """SB3's SAC MlpPolicy (net_arch [256, 256]): the actor (latent_pi, mu, log_std) and
    `n_critics` Q-networks on (obs, action); critic_target is a copy of the critic."""
    trunk = lambda d_in: ex.linear(hidden, d_in) + ex.linear(hidden, hidden)  # noqa: E731
    actor = trunk(obs_dim) + ex.linear(act_dim, hidden) + ex.linear(act_dim, hidden)
    critic = critics * (trunk(obs_dim + act_dim) + ex.linear(1, hidden))
    return actor, critic


@needs("stable_baselines3", "gymnasium")
def test_sb3_ppo_mlp_policy_learn_on_cuda(tmp_path):
    # MlpPolicy on CartPole: separate pi / vf trunks of 2 x 64 (tanh), action and value heads;
    # the same tensors as cleanrl's Agent
    params = ex.device_bytes(cleanrl_agent_shapes(**CARTPOLE), ex.FP32)
    est = estimate("r9_sb3_quickstart.py", "--algo", "ppo", "--timesteps", "128", cwd=tmp_path)
    assert_training(est, params=params, optimizer_state=2 * params)  # Adam(eps=1e-5)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["steps"] == 3  # 2 epochs x 2 minibatches of the first 64-step rollout
    assert "total_timesteps | 64" in est.stderr  # the first rollout's log table


@needs("stable_baselines3", "gymnasium")
def test_sb3_sac_mlp_policy_learn_on_cuda(tmp_path):
    actor, critic = sac_mlp_shapes(obs_dim=3, act_dim=1)  # Pendulum-v1
    trained = ex.device_bytes(actor + critic, ex.FP32)
    log_ent_coef = ex.BLOCK  # `th.log(th.ones(1, device=...)).requires_grad_(True)`, its own Adam
    # in this process (SB3's child path: the PPO test above)
    est = estimate_here("r9_sb3_quickstart.py", "--algo", "sac", "--timesteps", "48", cwd=tmp_path)
    # parameters: actor, critic and the frozen critic_target; Adam state for the actor, the
    # critic and log_ent_coef (three optimizers)
    assert_training(est, params=trained + ex.device_bytes(critic, ex.FP32) + log_ent_coef,
                    grads=trained + log_ent_coef,
                    optimizer_state=2 * (trained + log_ent_coef))
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # rollouts (predict under no_grad) between the gradient steps, learning_starts=32
    assert est.data["phases_ran"][:2] == ["training", "eval"]


# keras.io "Simple MNIST convnet" on Keras 3 with KERAS_BACKEND=torch ------------------------------

@needs("keras")
def test_keras_mnist_convnet_fit_on_the_torch_backend():
    # Conv2D kernels are (kh, kw, in, out); Dense sees the flattened 5 x 5 x 64 maps
    shapes = [(3, 3, 1, 32), (32,), (3, 3, 32, 64), (64,), (5 * 5 * 64, 10), (10,)]
    weights = ex.device_bytes(shapes, ex.FP32)
    seed_state = ex.BLOCK  # Dropout's SeedGenerator: a (2,) uint32 variable
    counters = 2 * ex.BLOCK  # the optimizer's `iterations` and `learning_rate` variables
    est = estimate("r9_keras_mnist_convnet.py", "--epochs", "2", "--samples", "600",
                   "--batch-size", "64")
    # Keras' own Adam (not torch.optim): m and v per trainable variable
    assert_training(est, params=weights + seed_state, grads=weights,
                    optimizer_state=2 * weights + counters)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # validation_split=0.1: 540 training samples in 9 batches, a validation pass per epoch
    assert "DataLoader epoch of 9 batches" in _notes(est)
    assert est.data["phases_ran"] == ["training", "eval", "training", "eval"]
    assert "Test accuracy:" in est.stderr


# PyTorch Geometric examples/gcn.py on a Planetoid dataset already processed ----------------------

CORA_LIKE = dict(nodes=120, features=48, classes=5, edges=600)


def _planetoid_cora(root) -> None:
    """`data/Planetoid/Cora` as Planetoid leaves it: the raw files present (nothing to download)
    and `processed/data.pt` written by PyG's own `InMemoryDataset.save`, from a seeded graph."""
    import torch
    from torch_geometric.data import Data, InMemoryDataset

    cora = root / "data" / "Planetoid" / "Cora"
    (cora / "raw").mkdir(parents=True)
    for name in ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index"):
        (cora / "raw" / f"ind.cora.{name}").touch()
    generator = torch.Generator().manual_seed(0)
    nodes = CORA_LIKE["nodes"]
    index = torch.arange(nodes)
    data = Data(x=torch.rand(nodes, CORA_LIKE["features"], generator=generator),
                edge_index=torch.randint(0, nodes, (2, CORA_LIKE["edges"]), generator=generator),
                y=torch.randint(0, CORA_LIKE["classes"], (nodes,), generator=generator),
                train_mask=index < 40, val_mask=(index >= 40) & (index < 80), test_mask=index >= 80)
    InMemoryDataset.save([data], str(cora / "processed" / "data.pt"))


@pytest.mark.slow
@needs("torch_geometric")
def test_pyg_gcn_example_on_planetoid(tmp_path):
    import shutil

    from tests.library_jobs.harness import SCRIPTS

    _planetoid_cora(tmp_path)
    (tmp_path / "examples").mkdir()
    shutil.copy(SCRIPTS / "r9_pyg_gcn.py", tmp_path / "examples" / "gcn.py")
    # GCNConv(48, 16) and GCNConv(16, 5): a bias-free Linear each, the bias kept by the conv
    shapes = [(16, CORA_LIKE["features"]), (16,), (CORA_LIKE["classes"], 16), (CORA_LIKE["classes"],)]
    params = ex.device_bytes(shapes, ex.FP32)
    # `test()` divides by `int(mask.sum())`: the masks moved from the host keep their values
    # through `sum` (capture/known_values.py), so fake mode runs it (before: zero, a division
    # by zero, and auto mode's eager rerun); `out[train_mask]` is sized by the known mask
    est = estimate(str(tmp_path / "examples" / "gcn.py"), "--epochs", "5", cwd=tmp_path)
    # Adam over the two parameter groups (weight decay on conv1 only): every tensor once
    assert_training(est, params=params, optimizer_state=2 * params)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # the bytes eager mode gives for this job (`--mode eager`: peak allocated 67,303,424 B)
    assert est.data["peak_allocated_bytes"] == 67_303_424
    assert "Epoch: 001, Loss:" in est.stderr
    # the whole graph went to the device at once (`dataset[0].to(device)`): features, edges,
    # labels and the three masks
    graph = ex.device_bytes([(120, 48)], ex.FP32) + ex.device_bytes([(2, 600), (120,)], 8) \
        + ex.device_bytes(3 * [(120,)], 1)
    assert est.breakdown["input"] >= graph, est.breakdown


# LightningCLI: `python main.py fit --config config.yaml` with overrides after it -----------------

@needs("lightning", "yaml")
def test_lightning_cli_fit_subcommand_with_a_yaml_config(tmp_path):
    import yaml

    from tests.library_jobs.harness import SCRIPTS

    params = ex.device_bytes(ex.linear(96, 32), ex.FP32)  # DemoModel's l1, out_dim 96 (config)
    est = estimate_here("r9_lightning_cli_main.py", "fit", "--config",
                        str(SCRIPTS / "r9_lightning_cli_config.yaml"), "--trainer.max_epochs=2",
                        cwd=tmp_path)  # in this process
    # the config's `optimizer:` (SGD with momentum: one buffer per parameter) replaced
    # DemoModel.configure_optimizers' Adam (two)
    assert_training(est, params=params, optimizer_state=params)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["steps"] == 7  # 3 batches and the last of epoch 0, the last of epoch 1
    # the CLI saved the config it ran with, the override applied
    config = yaml.safe_load((tmp_path / "lightning_logs" / "version_0" / "config.yaml").read_text())
    assert config["trainer"]["max_epochs"] == 2 and config["model"]["out_dim"] == 96
    assert config["optimizer"]["class_path"] == "torch.optim.SGD"


# Ray Train: TorchTrainer(ScalingConfig(num_workers=2, use_gpu=True)).fit() ----------------------

@needs("ray", "torchvision")
def test_ray_train_getting_started_pytorch_two_gpu_workers(tmp_path):
    shapes, buffers = ex.resnet18_shapes(classes=10)
    shapes[0] = (64, 1, 7, 7)  # the docs' 1-channel conv1 for FashionMNIST
    params = ex.device_bytes(shapes, ex.FP32)
    est = estimate("r9_ray_train_torch.py", "--epochs", "2", "--batch-size", "8",
                   "--samples", "64", timeout=200, cwd=tmp_path)
    # Adam, host `step`s; DDP (rank 0 of 2) keeps a bucket per gradient: up to params more
    assert_training(est, params=params, optimizer_state=2 * params, extra_upper=params)
    assert est.breakdown["buffer"] == ex.device_bytes(buffers, ex.FP32)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    notes = _notes(est)
    # the training function ran in the job's process as rank 0 of 2 (it waited for a GPU
    # worker of the local Ray cluster until the timeout before), the model wrapped in DDP
    # (`model.module.state_dict()` is how the docs save it)
    assert "rank 0 of 2, in a process group of 2" in notes
    assert "fake nccl process group of world size 2" in notes
    assert "loaded 11175370 parameters" in est.stderr  # the checkpoint read back after fit()
