# ruff: noqa: I001  (kept as the original script writes it)
"""Ray's "Get Started with Distributed Training using PyTorch" (ray-project/ray
doc/source/train/getting-started-pytorch.rst): a torchvision resnet18 with a 1-channel `conv1`,
`ray.train.torch.prepare_model` / `prepare_data_loader`, Adam, `ray.train.report(metrics,
checkpoint=Checkpoint.from_directory(...))` of `model.module.state_dict()` each epoch,
`ScalingConfig(num_workers=2, use_gpu=True)`, `TorchTrainer(...).fit()`, then the trained model
loaded from `result.checkpoint`. FashionMNIST downloads: `--samples` seeded 1 x 28 x 28 images
stand in for it (`--epochs` and `--batch-size` keep it small)."""
import argparse
import os
import tempfile

import torch
from torch.nn import CrossEntropyLoss
from torch.optim import Adam
from torch.utils.data import DataLoader, TensorDataset
from torchvision.models import resnet18

import ray.train.torch

parser = argparse.ArgumentParser()
parser.add_argument("--num-workers", type=int, default=2)
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--batch-size", type=int, default=128)
parser.add_argument("--samples", type=int, default=60000)
args = parser.parse_args()


def fashion_mnist_stand_in(samples):
    """FashionMNIST(root=data_dir, train=True, download=True, transform=Compose([ToTensor(),
    Normalize((0.28604,), (0.32025,))])): normalised images and labels of its shapes."""
    generator = torch.Generator().manual_seed(0)
    images = (torch.rand(samples, 1, 28, 28, generator=generator) - 0.28604) / 0.32025
    return TensorDataset(images, torch.randint(0, 10, (samples,), generator=generator))


def train_func():
    # Model, Loss, Optimizer
    model = resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(
        1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False
    )
    # [1] Prepare model.
    model = ray.train.torch.prepare_model(model)
    # model.to("cuda")  # This is done by `prepare_model`
    criterion = CrossEntropyLoss()
    optimizer = Adam(model.parameters(), lr=0.001)

    # Data
    train_data = fashion_mnist_stand_in(args.samples)
    train_loader = DataLoader(train_data, batch_size=args.batch_size, shuffle=True)
    # [2] Prepare dataloader.
    train_loader = ray.train.torch.prepare_data_loader(train_loader)

    # Training
    for epoch in range(args.epochs):
        if ray.train.get_context().get_world_size() > 1:
            train_loader.sampler.set_epoch(epoch)

        for images, labels in train_loader:
            # This is done by `prepare_data_loader`!
            # images, labels = images.to("cuda"), labels.to("cuda")
            outputs = model(images)
            loss = criterion(outputs, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        # [3] Report metrics and checkpoint.
        metrics = {"loss": loss.item(), "epoch": epoch}
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            torch.save(
                model.module.state_dict(),
                os.path.join(temp_checkpoint_dir, "model.pt")
            )
            ray.train.report(
                metrics,
                checkpoint=ray.train.Checkpoint.from_directory(temp_checkpoint_dir),
            )
        if ray.train.get_context().get_world_rank() == 0:
            print(metrics)


# [4] Configure scaling and resource requirements.
scaling_config = ray.train.ScalingConfig(num_workers=args.num_workers, use_gpu=True)

# [5] Launch distributed training job.
trainer = ray.train.torch.TorchTrainer(
    train_func,
    scaling_config=scaling_config,
    # [5a] If running in a multi-node cluster, this is where you
    # should configure the run's persistent storage that is accessible
    # across all worker nodes.
    # run_config=ray.train.RunConfig(storage_path="s3://..."),
)
result = trainer.fit()

# [6] Load the trained model.
with result.checkpoint.as_directory() as checkpoint_dir:
    model_state_dict = torch.load(os.path.join(checkpoint_dir, "model.pt"))
    model = resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(
        1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False
    )
    model.load_state_dict(model_state_dict)
print("loaded", sum(p.numel() for p in model.parameters()), "parameters")
