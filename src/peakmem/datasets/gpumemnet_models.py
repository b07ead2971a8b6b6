"""Rebuild a GPUMemNet row's training job: the exact nn.Module, a batch, and the training loop.

Follows ../shared/datasets/gpumemnet/README.md, "Rebuilding a row's job exactly". Common to all
families: fp32, Adam(lr=1e-3), CrossEntropyLoss, loop zero_grad -> forward -> loss -> backward ->
step -> loss.item(). Build on any device: `build_model(job, device="meta")` costs no memory.

What the data does not pin down (documented, not guessed silently):
- residual CNN: the stage loop's stop rule ("stop when size <= 7") uses the launcher's own size
  bookkeeping (`size // 2` per stride-2 block), recovered from the public layer lists.
- dense CNN: which blocks have a transition was random in the original launcher; it is recovered
  from the row's `Activations-Params` list (`gpumemnet_jobs.dense_transitions_from_layers`). Rows
  without a layer list (cnn_data_sample14) cannot be rebuilt: `CannotBuildJob`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from peakmem.datasets.gpumemnet_jobs import (
    ACTIVATIONS,
    CNNJob,
    GpuMemNetJob,
    MLPJob,
    TransformerJob,
)

MAX_FILTERS = 2048
DENSE_GROWTH = 32


class CannotBuildJob(ValueError):
    """The row does not carry enough information to rebuild its job exactly."""


def make_activation(name: str) -> nn.Module:
    return getattr(nn, ACTIVATIONS[name])()


# ---------------------------------------------------------------- MLP


def mlp_widths(job: MLPJob) -> list[int]:
    """Output width of each hidden Linear block (the head Linear(in, O) comes after)."""
    widths: list[int] = []
    width = job.input_size
    if job.arch == "uniform":
        return [job.input_size] * job.depth
    if job.arch in ("pyramid", "bottleneck"):
        blocks = job.depth + (1 if job.arch == "bottleneck" else 0)
        for _ in range(blocks):
            width = max(int(width * 0.5), job.output_size)
            widths.append(width)
        return widths
    if job.arch == "gradual":
        dec = (job.input_size - job.output_size) // job.depth
        for _ in range(job.depth):
            width = max(width - dec, job.output_size)
            widths.append(width)
        return widths
    raise CannotBuildJob(f"unknown MLP arch {job.arch!r}")


def build_mlp(job: MLPJob) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = job.input_size
    for out in mlp_widths(job):
        layers.append(nn.Linear(width, out))
        if job.batchnorm:
            layers.append(nn.BatchNorm1d(out))
        layers.append(make_activation(job.activation))
        if job.dropout:
            layers.append(nn.Dropout(job.dropout_p))
        width = out
    layers.append(nn.Linear(width, job.output_size))
    if job.softmax_head:
        layers.append(nn.Softmax(dim=1))
    return nn.Sequential(*layers)


# ---------------------------------------------------------------- CNN


def conv_block(
    job: CNNJob,
    cin: int,
    cout: int,
    stride: int = 1,
    *,
    kernel: int = 3,
    relu: bool = False,
    dropout: bool | None = None,
) -> nn.Sequential:
    """Conv2d(k, stride, pad k//2, bias) -> [BatchNorm2d] -> act -> [Dropout(p)]."""
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2)]
    if job.batchnorm:
        layers.append(nn.BatchNorm2d(cout))
    layers.append(nn.ReLU() if relu else make_activation(job.activation))
    if job.dropout if dropout is None else dropout:
        layers.append(nn.Dropout(job.dropout_p))
    return nn.Sequential(*layers)


def cnn_plain_channels(job: CNNJob) -> list[int]:
    """Output channels of each ConvBlock for the plain (non residual/dense) architectures."""
    f, d = job.base_filters, job.depth
    if job.arch == "uniform":
        return [f] * d
    if job.arch in ("pyramid", "gradual"):
        g = (MAX_FILTERS / f) ** (1 / d if job.arch == "pyramid" else 1 / (2 * d))
        return [min(int(f * g**i), MAX_FILTERS) for i in range(d)]
    if job.arch == "bottleneck":
        g = 2.0 if d <= 2 else (MAX_FILTERS / f) ** (1 / (d - 1))
        return [2 * f if i == 0 else min(int(f * g ** (i - 1)), MAX_FILTERS) for i in range(d)]
    if job.arch == "hourglass":
        c = d // 2
        e = d - c
        out = []
        for i in range(d):
            if i < c:
                out.append(min(int(f * ((MAX_FILTERS / f) ** (1 / c)) ** i), MAX_FILTERS))
            else:
                out.append(max(int(f * ((MAX_FILTERS / f) ** (1 / e)) ** (d - i - 1)), f))
        return out
    raise CannotBuildJob(f"not a plain CNN arch: {job.arch!r}")


class ResidualBlock(nn.Module):
    def __init__(self, job: CNNJob, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            parts: list[nn.Module] = [nn.Conv2d(cin, cout, 1, stride=stride)]
            if job.batchnorm:
                parts.append(nn.BatchNorm2d(cout))
            self.shortcut = nn.Sequential(*parts)
        self.block1 = conv_block(job, cin, cout, stride)
        self.block2 = conv_block(job, cout, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = self.shortcut(x)
        return self.block2(self.block1(x)) + identity


def residual_plan(job: CNNJob) -> list[tuple[int, int]]:
    """(out channels, stride) per residual block.

    Blocks i in range(D//2): out = min(int(F*g**i), 2048), g = (2048/F)**(1/D); stride 2 when i is
    odd and the size is > 7; stop once the size is <= 7 after a block. The launcher tracks the
    size as `size // 2` per stride-2 block, while the real conv gives ceil(size / 2): the stop
    rule follows the launcher's bookkeeping (this matches every public layer list, see
    tests/bench/test_gpumemnet_models.py), the tensors follow the conv.
    """
    f, d = job.base_filters, job.depth
    g = (MAX_FILTERS / f) ** (1 / d)
    size = job.input_size
    plan: list[tuple[int, int]] = []
    for i in range(d // 2):
        out = min(int(f * g**i), MAX_FILTERS)
        stride = 2 if (i % 2 == 1 and size > 7) else 1
        plan.append((out, stride))
        size = size // stride  # the launcher's bookkeeping, not the conv's ceil
        if size <= 7:
            break
    return plan


class DenseBlock(nn.Module):
    def __init__(self, job: CNNJob, cin: int, layers: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            conv_block(job, cin + k * DENSE_GROWTH, DENSE_GROWTH) for k in range(layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.cat([x, layer(x)], dim=1)
        return x


class CNNClassifier(nn.Module):
    def __init__(self, features: nn.Module, channels: int, num_classes: int) -> None:
        super().__init__()
        self.features = features
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.features(x)).flatten(1)
        return self.softmax(self.fc(x))


def build_cnn(job: CNNJob) -> CNNClassifier:
    blocks: list[nn.Module] = []
    channels = job.input_channels
    if job.arch == "residual":
        for out, stride in residual_plan(job):
            blocks.append(ResidualBlock(job, channels, out, stride))
            channels = out
    elif job.arch == "dense":
        if job.dense_transitions is None:
            raise CannotBuildJob(
                "dense CNN row without a layer list: transition positions are unknown"
            )
        for k in range(job.depth // 4):
            blocks.append(DenseBlock(job, channels))
            channels += 4 * DENSE_GROWTH
            if k in job.dense_transitions:
                half = channels // 2
                blocks.append(
                    nn.Sequential(
                        conv_block(job, channels, half, kernel=1, relu=True, dropout=False),
                        nn.AvgPool2d(2),
                    )
                )
                channels = half
    else:
        for out in cnn_plain_channels(job):
            blocks.append(conv_block(job, channels, out))
            channels = out
    return CNNClassifier(nn.Sequential(*blocks), channels, job.num_classes)


# ---------------------------------------------------------------- Transformer


class TransformerClassifier(nn.Module):
    def __init__(self, job: TransformerJob) -> None:
        super().__init__()
        self.embedding = nn.Embedding(job.vocab_size, job.embedding_size)
        self.positional = nn.Parameter(torch.zeros(1, job.seq_length, job.embedding_size))
        layer = nn.TransformerEncoderLayer(
            job.embedding_size,
            job.num_heads,
            job.ff_hidden_size,
            job.dropout_rate,
            batch_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, job.num_layers, enable_nested_tensor=False)
        self.fc = nn.Linear(job.embedding_size, job.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embedding(x) + self.positional
        return self.fc(self.encoder(h).mean(dim=1))


# ---------------------------------------------------------------- jobs

_BUILDERS: dict[type, Callable[[GpuMemNetJob], nn.Module]] = {
    MLPJob: build_mlp,
    CNNJob: build_cnn,
    TransformerJob: TransformerClassifier,
}


def build_model(job: GpuMemNetJob, device: str | torch.device = "meta") -> nn.Module:
    """The job's nn.Module, created directly on `device` (meta: no memory, no init cost).

    On the default device already (the GPUMemNet launchers' CPU build) no device context is
    pushed: every tensor lands there anyway, and each torch call of the build skips a
    torch-function mode's Python (in a capture, a CNN row's build ~1.5x slower with it)."""
    builder = _BUILDERS[type(job)]
    if torch.device(device) == torch.get_default_device():
        return builder(job)
    with torch.device(device):
        return builder(job)


def num_classes(job: GpuMemNetJob) -> int:
    return job.output_size if isinstance(job, MLPJob) else job.num_classes


def num_samples(job: GpuMemNetJob) -> int:
    if isinstance(job, CNNJob):
        raise CannotBuildJob("the CNN launcher's dataset size is not in the row")
    return job.num_samples


def make_batch(
    job: GpuMemNetJob, batch_size: int | None = None, device: str | torch.device = "meta"
) -> tuple[torch.Tensor, torch.Tensor]:
    """One (inputs, targets) batch as the job's DataLoader yields it."""
    b = job.batch_size if batch_size is None else batch_size
    targets = torch.randint(0, max(num_classes(job), 1), (b,), device=device)
    if isinstance(job, MLPJob):
        return torch.randn(b, job.input_size, device=device), targets
    if isinstance(job, CNNJob):
        shape = (b, job.input_channels, job.input_size, job.input_size)
        return torch.randn(*shape, device=device), targets
    tokens = torch.randint(0, job.vocab_size, (b, job.seq_length), device=device)
    return tokens, targets


@dataclass(frozen=True)
class TrainingLoop:
    """Everything about the job's loop besides the model: what to run and in what order."""

    batch_sizes: tuple[int, ...]  # one epoch's batch sizes (the last batch may be smaller)
    warmup_batches: tuple[int, ...]  # forward passes before training (summary), in order
    warmup_grad: bool  # whether the warm-up passes ran with autograd enabled
    lr: float = 1e-3


def training_loop(job: GpuMemNetJob) -> TrainingLoop:
    if isinstance(job, MLPJob):
        full, rest = divmod(job.num_samples, job.batch_size)
        sizes = (job.batch_size,) * full + ((rest,) if rest else ())
        return TrainingLoop(sizes, (job.summary_batch,), warmup_grad=True)
    if isinstance(job, TransformerJob):
        full, rest = divmod(job.num_samples, job.batch_size)
        sizes = (job.batch_size,) * full + ((rest,) if rest else ())
        return TrainingLoop(sizes, (job.batch_size,) * job.summary_passes, warmup_grad=True)
    # CNN: dataset length not recorded; every step sees a full batch in the first epoch
    return TrainingLoop((job.batch_size,), (job.summary_batch,), warmup_grad=True)


def train_steps(
    job: GpuMemNetJob, model: nn.Module, steps: int, device: str | torch.device
) -> Iterator[float]:
    """Run the job's real loop for `steps` steps on `device`, yielding each loss.item()."""
    loop = training_loop(job)
    model.train()
    for b in loop.warmup_batches:
        with torch.set_grad_enabled(loop.warmup_grad):
            model(make_batch(job, b, device)[0])
    optimizer = torch.optim.Adam(model.parameters(), lr=loop.lr)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(steps):
        inputs, targets = make_batch(job, loop.batch_sizes[step % len(loop.batch_sizes)], device)
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        yield loss.item()


def per_sample_layer_outputs(job: GpuMemNetJob) -> list[tuple[str, int, int]]:
    """(layer class, per-sample output elements, own params) of each leaf module in call order,
    from forward hooks on a meta-device model (the shape of `Activations-Params`)."""
    model = build_model(job, "meta")
    records: list[tuple[str, int, int]] = []

    def hook(module: nn.Module, _inputs: object, output: object) -> None:
        if isinstance(output, torch.Tensor):
            params = sum(p.numel() for p in module.parameters(recurse=False))
            records.append((type(module).__name__, math.prod(output.shape[1:]), params))

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    try:
        with torch.no_grad():
            model(make_batch(job, 2, "meta")[0])  # batch 2: BatchNorm needs > 1
    finally:
        for h in handles:
            h.remove()
    return records
