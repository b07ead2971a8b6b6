"""A GPUMemNet Transformer job rebuilt from its row's file name (datasets/gpumemnet/README.md).

    python transformer_job.py "num_classes:273_embedding_size:128_num_layers:8_num_heads:8_ff_hidden_size:332_dropout_rate:0.16_seq_length:512_input_size:553893_num_samples:1527_batch_size:64.out"
"""

import re
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

KEYS = (
    "num_classes", "embedding_size", "num_layers", "num_heads", "ff_hidden_size", "dropout_rate",
    "seq_length", "input_size", "num_samples", "batch_size",
)


def parse(name: str) -> dict:
    pattern = "_".join(f"{key}:([^_]+)" for key in KEYS)
    values = re.search(pattern, name.removesuffix(".out")).groups()
    return {key: float(value) if key == "dropout_rate" else int(value) for key, value in zip(KEYS, values, strict=True)}


class Classifier(nn.Module):
    def __init__(self, c: dict) -> None:
        super().__init__()
        width = c["embedding_size"]
        self.embedding = nn.Embedding(c["input_size"], width)
        self.position = nn.Parameter(torch.zeros(1, c["seq_length"], width))
        layer = nn.TransformerEncoderLayer(
            width, c["num_heads"], c["ff_hidden_size"], c["dropout_rate"], batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, c["num_layers"])
        self.head = nn.Linear(width, c["num_classes"])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(self.embedding(tokens) + self.position)
        return self.head(hidden.mean(dim=1))


def main() -> None:
    c = parse(sys.argv[1])
    device = torch.device("cuda")
    model = Classifier(c).to(device).train()
    for _ in range(2):  # two train-mode forward passes before training
        model(torch.randint(0, c["input_size"], (c["batch_size"], c["seq_length"]), device=device))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    data = TensorDataset(
        torch.randint(0, c["input_size"], (c["num_samples"], c["seq_length"])),
        torch.randint(0, c["num_classes"], (c["num_samples"],)),
    )
    loader = DataLoader(data, batch_size=c["batch_size"], shuffle=True, num_workers=2, pin_memory=True)
    for _epoch in range(100):
        for tokens, labels in loader:
            tokens, labels = tokens.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(tokens), labels)
            loss.backward()
            optimizer.step()
            loss.item()


if __name__ == "__main__":
    main()
