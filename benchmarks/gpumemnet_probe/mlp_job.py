"""A GPUMemNet MLP job rebuilt from its row's file name (datasets/gpumemnet/README.md).

    python mlp_job.py "input:1259_output:79_depth:8_arch:pyramid_batch:717.out"
    python mlp_job.py "input:2346_output:197_depth:2_arch:pyramid_batch:996_act:relu_dropout:0.33_dropout:True_batchnorm:True.out"

Step 1 rows: Linear -> ReLU blocks. Step 2 rows: Linear -> [BatchNorm1d] -> act -> [Dropout(p)]
blocks and a final Softmax when there is more than one output.
"""

import re
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ACTIVATIONS = {
    "relu": nn.ReLU, "leaky_relu": nn.LeakyReLU, "prelu": nn.PReLU, "elu": nn.ELU, "selu": nn.SELU,
    "tanh": nn.Tanh, "softplus": nn.Softplus, "swish": nn.SiLU, "mish": nn.Mish, "gelu": nn.GELU,
    "identity": nn.Identity,
}


def parse(name: str) -> dict:
    name = name.removesuffix(".out")
    fields = dict(re.findall(r"(input|output|depth|arch|batch):([^_]+)", name))
    config = {key: fields[key] if key == "arch" else int(fields[key]) for key in fields}
    step2 = re.search(r"_act:(.+?)_dropout:([^_]+)_dropout:(True|False)_batchnorm:(True|False)", name)
    config["step2"] = step2 is not None
    if step2:
        config["act"], p, use_dropout, use_bn = step2.groups()
        config["p"], config["dropout"], config["bn"] = float(p), use_dropout == "True", use_bn == "True"
    else:
        config.update(act="relu", p=0.0, dropout=False, bn=False)
    return config


def widths(config: dict) -> list[int]:
    width, out, depth, arch = config["input"], config["output"], config["depth"], config["arch"]
    sizes = [width]
    if arch == "uniform":
        return sizes * (depth + 1)
    blocks = depth + 1 if arch == "bottleneck" else depth
    step = (config["input"] - out) // depth if arch == "gradual" else 0
    for _ in range(blocks):
        width = max(width - step, out) if arch == "gradual" else max(int(width * 0.5), out)
        sizes.append(width)
    return sizes


def build(config: dict) -> nn.Module:
    layers: list[nn.Module] = []
    sizes = widths(config)
    for fan_in, fan_out in zip(sizes, sizes[1:], strict=False):
        layers.append(nn.Linear(fan_in, fan_out))
        if config["bn"]:
            layers.append(nn.BatchNorm1d(fan_out))
        layers.append(ACTIVATIONS[config["act"]]())
        if config["dropout"]:
            layers.append(nn.Dropout(config["p"]))
    layers.append(nn.Linear(sizes[-1], config["output"]))
    if config["step2"] and config["output"] > 1:
        layers.append(nn.Softmax(dim=1))
    return nn.Sequential(*layers)


def main() -> None:
    config = parse(sys.argv[1])
    device = torch.device("cuda")
    model = build(config).to(device)
    model(torch.rand(2, config["input"], device=device))  # the model summary pass
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    data = TensorDataset(torch.randn(4096, config["input"]), torch.randint(0, config["output"], (4096,)))
    loader = DataLoader(data, batch_size=config["batch"], shuffle=True)
    for _epoch in range(100):
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            loss.item()


if __name__ == "__main__":
    main()
