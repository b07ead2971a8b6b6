"""The three GPUMemNet synthetic job families (MLP, CNN, Transformer), rebuilt exactly from a
row's `Filename` configuration string as ../shared/datasets/gpumemnet/README.md describes:
fp32, Adam(lr=1e-3), CrossEntropyLoss, host data through a DataLoader, and the loop
zero_grad -> forward -> loss -> backward -> step -> loss.item().

    python gpumemnet.py --config "input:1259_output:79_depth:8_arch:pyramid_batch:717"

The models come from peakmem.datasets.gpumemnet_models (one builder for the bench, the baselines
and this script, checked layer by layer against the rows' published layer lists).

Transformer jobs run the published launcher's own loop (itu-rad/GPUMemNet
`NeuroNetGen_scripts/Transformer/transformer.py`, `train_model`): besides the step it reads
`loss.item()`, `torch.max(outputs, 1)` and `(predicted == labels).sum().item()` each batch, so the
previous batch's outputs, max values and predictions stay alive through the next forward and
backward; the summary's `mock_input` batch stays alive for the whole run.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch
from _common import base_parser, report, setup, train
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from peakmem.datasets.gpumemnet_jobs import (
    CNNJob,
    JobParseError,
    MLPJob,
    TransformerJob,
    parse_job,
)
from peakmem.datasets.gpumemnet_models import CannotBuildJob, build_model, num_classes


class RandomImages(Dataset):
    """`randn(C, S, S)` per sample, a random label: the CNN launcher's dataset."""

    def __init__(self, shape: tuple[int, ...], classes: int, length: int) -> None:
        self.shape, self.classes, self.length = shape, classes, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.randn(*self.shape), int(torch.randint(0, self.classes, ()))


def forever(loader: DataLoader, device: torch.device):
    for _epoch in itertools.count():
        for x, y in loader:
            yield x.to(device), y.to(device)


def launcher_train_model(
    model: nn.Module, loader: DataLoader, device: torch.device, steps: int
) -> float:
    """GPUMemNet's Transformer `train_model` for `steps` batches (the original stopped after
    60 s): per batch `inputs, labels = batch` (the host tensors replace the previous device
    ones before the copy), zero_grad -> forward -> loss -> backward -> step, then the accuracy
    bookkeeping whose tensors (outputs, max values, predictions) live on into the next batch."""
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    total_loss, correct, total, done = 0.0, 0, 0, 0
    while done < steps:  # epochs
        for batch in loader:
            inputs, labels = batch
            inputs, labels = inputs.to(device), labels.to(device)
            optimizer.zero_grad()
            outputs = model(inputs)
            loss = criterion(outputs, labels)
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
            _, predicted = torch.max(outputs, 1)
            correct += (predicted == labels).sum().item()
            total += labels.size(0)
            done += 1
            if done >= steps:
                break
    return total_loss / max(done, 1)


def main() -> None:
    parser = base_parser(__doc__)
    parser.set_defaults(optimizer="adam", lr=1e-3, steps=None)
    parser.add_argument("--config", required=True, help="a GPUMemNet row's Filename")
    parser.add_argument("--num-workers", type=int, default=None,
                        help="DataLoader workers (default: 0 for MLP, 2 for CNN/Transformer)")
    parser.add_argument("--dense-transitions", default=None, metavar="I,J,...",
                        help="dense CNNs: the dense blocks followed by a transition (random in "
                        "the original launcher; recovered from the row's layer list)")
    parser.add_argument("--samples", type=int, default=None,
                        help="dataset length (default: 4096 MLP, N Transformer, 64 batches CNN)")
    args = parser.parse_args()
    if args.grad_checkpointing:
        parser.error("--grad-checkpointing is not part of the GPUMemNet jobs")
    try:
        job = parse_job(args.config)
        if args.dense_transitions is not None and isinstance(job, CNNJob):
            picked = tuple(int(i) for i in args.dense_transitions.split(",") if i.strip())
            job = dataclasses.replace(job, dense_transitions=picked)
        model = build_model(job, "cpu")
    except (JobParseError, CannotBuildJob, ValueError) as exc:
        parser.error(str(exc))
    device = setup(args)
    classes = max(num_classes(job), 1)
    model = model.to(device)
    model.train()
    if isinstance(job, MLPJob):
        n = args.samples or job.num_samples
        data = TensorDataset(torch.randn(n, job.input_size), torch.randint(0, classes, (n,)))
        model(torch.randn(job.summary_batch, job.input_size, device=device))  # model summary
        workers, pin = 0, False
    elif isinstance(job, CNNJob):
        shape = (job.input_channels, job.input_size, job.input_size)
        data = RandomImages(shape, classes, args.samples or 64 * job.batch_size)
        workers, pin = 2, args.device == "cuda"
        model(torch.rand(job.summary_batch, *shape, device=device))  # torchsummary's pass
    else:
        n = args.samples or job.num_samples
        data = TensorDataset(torch.randint(0, job.vocab_size, (n, job.seq_length)),
                             torch.randint(0, classes, (n,)))
        # the launcher's `mock_input`: a module-level name, alive for the whole run
        mock_input = torch.randint(0, job.vocab_size, (job.batch_size, job.seq_length),
                                   device=device)
        for _ in range(job.summary_passes):  # the check pass and modelsummary's pass, with grad
            model(mock_input)
        workers, pin = 2, args.device == "cuda"
    if args.num_workers is not None:
        workers = args.num_workers
    loader = DataLoader(data, batch_size=job.batch_size, shuffle=True, num_workers=workers,
                        pin_memory=pin)
    if args.steps is None:  # the original ran ~60 s: many epochs; two cover the smaller last batch
        args.steps = 2 * len(loader) + 2
    if isinstance(job, TransformerJob):
        report(f"gpumemnet-{job.family}", launcher_train_model(model, loader, device, args.steps))
        return
    loss = nn.CrossEntropyLoss()

    def loss_fn(m: nn.Module, xy: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return loss(m(xy[0]), xy[1])

    report(f"gpumemnet-{job.family}", train(model, None, loss_fn, args, forever(loader, device)))


if __name__ == "__main__":
    main()
