"""Round 18: well-known public scripts not covered before, re-created in their upstream
structure (read through the code search, written here; each docstring names the upstream file
and version) and run unmodified through the capture on tiny local data; device bytes worked out
by hand (not read from peakmem):

- pyg-team/pytorch_geometric examples/compile/gin.py (scripts/r18_pyg_compile_gin.py):
  TUDataset MUTAG from local raw files, graph mini-batches (`Batch.to(device)`), a GIN of
  `MLP`s, `torch_geometric.compile(model, dynamic=True, fullgraph=True)`. Worked as it is
  (the compile is not applied: the traced activations are an upper bound, said in a note).
- pytorch/tutorials beginner_source/fgsm_tutorial.py (scripts/r18_fgsm_tutorial.py): no
  optimizer; a local LeNet checkpoint, input gradients through an eval-mode model, one image a
  batch, a skip steered by `init_pred.item() != target.item()`. Worked as it is.
- pytorch/tutorials beginner_source/finetuning_torchvision_models_tutorial.py
  (scripts/r18_finetuning_torchvision_models_tutorial.py): squeezenet1_0 from the torch.hub
  cache, feature extraction, `copy.deepcopy(model.state_dict())` best weights, then the same
  model from scratch. Worked as it is.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import SCRIPTS, JobEstimate, estimate_here, write_mnist
from tests.library_jobs.test_library_jobs import assert_training, needs
from tests.library_jobs.test_library_jobs_r14 import _hub_weights, _torchvision

pytestmark = pytest.mark.slow


def _notes(est: JobEstimate) -> str:
    return "\n".join(est.data.get("notes", []))


# pyg-team/pytorch_geometric examples/compile/gin.py ---------------------------------------------

GRAPHS, NODES, NODE_LABELS, EDGE_LABELS = 150, 20, 7, 4


def write_mutag(root: Path) -> None:
    """TUDataset's raw files for 'MUTAG' under root/MUTAG/raw (1-based node ids): 150 chain
    graphs of 20 nodes (19 undirected edges, both directions listed), node labels 0..6 (one-hot:
    7 features), edge labels 0..3 (one-hot edge_attr: 4), graph labels -1 / 1 (2 classes). With
    the raw files present nothing is downloaded."""
    raw = root / "MUTAG" / "raw"
    raw.mkdir(parents=True)
    edges, indicator, node_labels, edge_labels = [], [], [], []
    for g in range(GRAPHS):
        first = 1 + g * NODES
        for i in range(NODES):
            indicator.append(g + 1)
            node_labels.append(i % NODE_LABELS)
        for i in range(NODES - 1):
            for a, b in ((i, i + 1), (i + 1, i)):
                edges.append(f"{first + a}, {first + b}")
                edge_labels.append(i % EDGE_LABELS)
    files = {"A": edges, "graph_indicator": indicator, "node_labels": node_labels,
             "edge_labels": edge_labels, "graph_labels": [1 if g % 2 else -1 for g in range(GRAPHS)]}
    for name, rows in files.items():
        (raw / f"MUTAG_{name}.txt").write_text("\n".join(map(str, rows)) + "\n")


def gin_shapes(features: int, hidden: int, classes: int, layers: int) -> list[ex.Shape]:
    """Per GINConv an MLP([in, h, h]): Linear, BatchNorm (weight, bias), Linear (the last layer
    plain); then MLP([h, h, classes], norm=None): two Linears."""
    shapes: list[ex.Shape] = []
    for _ in range(layers):
        shapes += ex.linear(hidden, features) + [(hidden,), (hidden,)] + ex.linear(hidden, hidden)
        features = hidden
    return shapes + ex.linear(hidden, hidden) + ex.linear(classes, hidden)


@needs("torch_geometric")
def test_pyg_compile_gin_graph_batches(tmp_path):
    write_mutag(tmp_path / "data" / "TU")
    (tmp_path / "examples" / "compile").mkdir(parents=True)
    shutil.copy(SCRIPTS / "r18_pyg_compile_gin.py", tmp_path / "examples" / "compile" / "gin.py")
    hidden, layers, batch = 32, 5, 128
    params = ex.device_bytes(gin_shapes(NODE_LABELS, hidden, 2, layers), ex.FP32)
    est = estimate_here(str(tmp_path / "examples" / "compile" / "gin.py"),
                        flags=("--gpu", "h100-80gb"), cwd=tmp_path)
    # Adam: two moments; at the peak (in the backward) only the head's gradients exist
    head = ex.device_bytes(ex.linear(hidden, hidden) + ex.linear(2, hidden), ex.FP32)
    assert_training(est, params=params, optimizer_state=2 * params,
                    extra_upper=est.breakdown["workspace"])
    assert est.breakdown["gradient"] == head
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # per conv: BatchNorm's running mean / var / num_batches_tracked and GINConv's eps buffer
    assert est.breakdown["buffer"] == layers * 4 * ex.BLOCK
    # one Batch of 128 graphs x 20 nodes, 38 directed edges each: x (2560, 7) fp32, edge_index
    # (2, 4864) int64, edge_attr (4864, 4) fp32, y (128,), batch (2560,), ptr (129,) int64
    nodes, edges = batch * NODES, batch * 2 * (NODES - 1)
    graph = (ex.device_bytes([(nodes, NODE_LABELS), (edges, EDGE_LABELS)], ex.FP32)
             + ex.device_bytes([(2, edges), (batch,), (nodes,), (batch + 1,)], 8))
    assert est.breakdown["input"] == graph
    # the compile is not applied (the activations are an upper bound for the compiled run)
    assert "torch.compile was not applied: GIN ran eagerly" in _notes(est)
    # 135 training graphs: 2 batches an epoch; the loop over 100 epochs was ended, test() ran
    assert "Epoch: 001, Loss:" in est.stderr
    assert "an evaluation phase (forward passes without gradients) ran" in _notes(est)


# pytorch/tutorials beginner_source/fgsm_tutorial.py ----------------------------------------------

LENET = {"conv1.weight": (32, 1, 3, 3), "conv1.bias": (32,), "conv2.weight": (64, 32, 3, 3),
         "conv2.bias": (64,), "fc1.weight": (128, 9216), "fc1.bias": (128,),
         "fc2.weight": (10, 128), "fc2.bias": (10,)}


@needs("torchvision", "matplotlib")
def test_fgsm_tutorial_input_gradients_without_an_optimizer(tmp_path, monkeypatch):
    import struct

    import torch

    # the tutorial reads MNIST from '../data' and the checkpoint from 'data/' of its folder
    write_mnist(tmp_path / "data" / "MNIST" / "raw", train=10, test=20)
    labels = tmp_path / "data" / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    # every test label 0: the skip `init_pred.item() != target.item()` compares with fake
    # mode's 0 read, so every traced image is attacked (a backward each)
    labels.write_bytes(struct.pack(">II", 2049, 20) + bytes(20))
    (tmp_path / "tut" / "data").mkdir(parents=True)
    torch.save({k: torch.zeros(v) for k, v in LENET.items()},
               tmp_path / "tut" / "data" / "lenet_mnist_model.pth")
    shutil.copy(SCRIPTS / "r18_fgsm_tutorial.py", tmp_path / "tut" / "fgsm_tutorial.py")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    est = estimate_here(str(tmp_path / "tut" / "fgsm_tutorial.py"), flags=("--gpu", "h100-80gb"),
                        cwd=tmp_path / "tut")
    assert est.returncode == 0, est.failure()
    params = ex.device_bytes(LENET.values(), ex.FP32)
    assert est.breakdown["parameter"] == params
    # no optimizer: nothing to step, no state; the parameters' gradients are made by each
    # backward (model.zero_grad() set them to None): at the peak all but conv1's
    assert "optimizer_state" not in est.breakdown and est.data["steps"] == 0
    conv1 = ex.device_bytes([LENET["conv1.weight"], LENET["conv1.bias"]], ex.FP32)
    assert est.breakdown["gradient"] == params - conv1
    # 7 epsilons x (3 traced images + the epoch's last): one backward each. Before
    # capture/discarded_grads.py the epoch waited for optimizer steps: all 20 images were
    # traced each time while `len(test_loader)` said 4 ("20 / 4 = 5.0")
    assert "the job ran 28 backward pass(es) but no optimizer step" in _notes(est)
    assert est.stderr.count("Test Accuracy = 4 / 4 = 1.0") == 7
    # one (1, 1, 28, 28) image and its label on the device
    assert est.breakdown["input"] >= ex.rounded(28 * 28 * ex.FP32) + ex.BLOCK
    assert est.data["peak_allocated_bytes"] >= params + (params - conv1)


# pytorch/tutorials beginner_source/finetuning_torchvision_models_tutorial.py --------------------

@pytest.fixture(scope="module")
def finetuning(tmp_path_factory) -> JobEstimate:
    import numpy as np
    from PIL import Image

    workdir = tmp_path_factory.mktemp("r18-finetuning")
    rng = np.random.default_rng(0)
    root = workdir / "data" / "hymenoptera_data"
    # 16 training images: 2 batches of 8 an epoch; 8 validation images: 1 batch
    for split, n in (("train", 8), ("val", 4)):
        for cls in ("ants", "bees"):
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 255, (240, 260, 3), dtype=np.uint8)).save(
                    root / split / cls / f"{i}.jpg")
    _hub_weights(workdir / "torch_home", "squeezenet1_0", "squeezenet1_0-b66bff10.pth")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_HOME", str(workdir / "torch_home"))
        patch.setenv("MPLBACKEND", "Agg")
        return estimate_here("r18_finetuning_torchvision_models_tutorial.py", cwd=workdir,
                             flags=("--gpu", "h100-80gb"), timeout=600)


@needs("torchvision", "matplotlib")
def test_finetuning_tutorial_feature_extract_then_scratch(finetuning):
    import torch

    est = finetuning
    with torch.device("meta"):
        model = _torchvision().models.squeezenet1_0()
    model.classifier[1] = torch.nn.Conv2d(512, 2, kernel_size=(1, 1), device="meta")
    weights = ex.device_bytes([tuple(p.shape) for p in model.parameters()], ex.FP32)
    head = ex.device_bytes([(2, 512, 1, 1), (2,)], ex.FP32)
    # the peak is the scratch model's training: both models on the device, the scratch model's
    # SGD momentum for every parameter and the feature-extract SGD's (still referenced) for the
    # head it trained
    assert_training(est, params=2 * weights, optimizer_state=weights + head, grads=weights,
                    extra_upper=est.breakdown["activation"] + est.breakdown.get("model_copy", 0))
    # the scratch run's best weights (`copy.deepcopy(model.state_dict())` right after the first
    # run's last validation forward) are a model copy, not activations (capture/model_copies.py)
    # (before: `activation`, 271,960,064 B here; now 269,008,384 B of activations + this copy)
    assert est.breakdown.get("model_copy") == weights, est.breakdown
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # a batch of 8 (3, 224, 224) fp32 crops and its int64 labels
    assert est.breakdown["input"] == ex.rounded(8 * 3 * 224 * 224 * ex.FP32) + ex.BLOCK
    # both train_model calls ran their 15 epochs (the ended loop's later epochs one batch)
    assert est.stderr.count("Epoch 14/14") == 2 and est.stderr.count("Best val Acc") == 2
    assert "training loop ended early" in _notes(est)
    assert "num_workers=4 loaded its batches in the main process" in _notes(est)
