"""The three GPUMemNet synthetic job families (MLP, CNN, Transformer), rebuilt exactly from a
row's `Filename` configuration string as /work/shared/datasets/gpumemnet/README.md describes:
fp32, Adam(lr=1e-3), CrossEntropyLoss, host data through a DataLoader, and the loop
zero_grad -> forward -> loss -> backward -> step -> loss.item().

    python gpumemnet.py --config "input:1259_output:79_depth:8_arch:pyramid_batch:717"
"""

from __future__ import annotations

import itertools

import torch
from _common import base_parser, report, setup, train
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

MAX_FILTERS = 2048
# every key a configuration string uses (the value may itself contain "_": leaky_relu)
KEYS = (
    "input", "output", "depth", "arch", "batch", "act", "dropout", "batchnorm",
    "input_channels", "num_classes", "base_filters", "input_size", "embedding_size",
    "num_layers", "num_heads", "ff_hidden_size", "dropout_rate", "seq_length", "num_samples",
    "batch_size",
)  # fmt: skip
ACTIVATIONS = {
    "relu": nn.ReLU, "leaky_relu": nn.LeakyReLU, "prelu": nn.PReLU, "elu": nn.ELU,
    "selu": nn.SELU, "tanh": nn.Tanh, "softplus": nn.Softplus, "swish": nn.SiLU,
    "mish": nn.Mish, "gelu": nn.GELU, "identity": nn.Identity,
}  # fmt: skip


def parse_config(text: str) -> list[tuple[str, str]]:
    """`a:1_b_c:x_y_d:2` -> [(a, 1), (b_c, x_y), (d, 2)] using the known keys; keys may repeat
    (`dropout:p_dropout:True`). A trailing `.out` is ignored."""
    text = text.strip().removesuffix(".out")
    parts = text.split(":")
    if len(parts) < 2:
        raise ValueError(f"not a GPUMemNet configuration: {text!r}")
    pairs, key = [], parts[0]
    for middle in parts[1:-1]:
        nxt = max((k for k in KEYS if middle.endswith("_" + k)), key=len, default=None)
        if nxt is None:
            raise ValueError(f"cannot split {middle!r} in {text!r}")
        pairs.append((key, middle[: -len(nxt) - 1]))
        key = nxt
    pairs.append((key, parts[-1]))
    unknown = [k for k, _ in pairs if k not in KEYS]
    if unknown:
        raise ValueError(f"unknown keys {unknown} in {text!r}")
    return pairs


def family_of(pairs: list[tuple[str, str]]) -> str:
    keys = {k for k, _ in pairs}
    if "input_channels" in keys:
        return "cnn"
    if "embedding_size" in keys:
        return "transformer"
    return "mlp"


def _options(pairs: list[tuple[str, str]]) -> tuple[dict[str, str], float, bool, bool]:
    """Plain keys, plus (dropout p, dropout on, batchnorm on) from the repeated dropout key."""
    values: dict[str, str] = {}
    dropouts = [v for k, v in pairs if k == "dropout"]
    for k, v in pairs:
        values.setdefault(k, v)
    p = float(dropouts[0]) if dropouts else 0.0
    use_dropout = len(dropouts) > 1 and dropouts[1] == "True"
    use_bn = values.get("batchnorm") == "True"
    return values, p, use_dropout, use_bn


# --- MLP ---


def mlp_widths(arch: str, inp: int, out: int, depth: int) -> list[int]:
    widths, width = [], inp
    blocks = depth + 1 if arch == "bottleneck" else depth
    for _ in range(blocks):
        if arch in ("pyramid", "bottleneck"):
            width = max(int(width * 0.5), out)
        elif arch == "uniform":
            pass
        elif arch == "gradual":
            width = max(width - (inp - out) // depth, out)
        else:
            raise ValueError(f"unknown MLP arch {arch!r}")
        widths.append(width)
    return widths


def build_mlp(values, p, use_dropout, use_bn) -> tuple[nn.Module, int, int]:
    inp, out, depth = int(values["input"]), int(values["output"]), int(values["depth"])
    step2 = "act" in values
    act = ACTIVATIONS[values.get("act", "relu")]
    layers: list[nn.Module] = []
    width = inp
    for nxt in mlp_widths(values["arch"], inp, out, depth):
        layers.append(nn.Linear(width, nxt))
        if step2 and use_bn:
            layers.append(nn.BatchNorm1d(nxt))
        layers.append(act())
        if step2 and use_dropout:
            layers.append(nn.Dropout(p))
        width = nxt
    layers.append(nn.Linear(width, out))
    if step2 and out > 1:
        layers.append(nn.Softmax(dim=1))
    return nn.Sequential(*layers), inp, out


# --- CNN ---


class ConvBlock(nn.Sequential):
    def __init__(self, cin, cout, act, stride=1, use_bn=False, p=0.0, use_dropout=False):
        layers = [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=True)]
        if use_bn:
            layers.append(nn.BatchNorm2d(cout))
        layers.append(act())
        if use_dropout:
            layers.append(nn.Dropout(p))
        super().__init__(*layers)


class Residual(nn.Module):
    def __init__(self, cin, cout, stride, act, use_bn, p, use_dropout):
        super().__init__()
        self.body = nn.Sequential(
            ConvBlock(cin, cout, act, stride, use_bn, p, use_dropout),
            ConvBlock(cout, cout, act, 1, use_bn, p, use_dropout),
        )
        self.shortcut: nn.Module = nn.Identity()
        if cin != cout or stride != 1:
            short = [nn.Conv2d(cin, cout, 1, stride=stride)]
            if use_bn:
                short.append(nn.BatchNorm2d(cout))
            self.shortcut = nn.Sequential(*short)

    def forward(self, x):
        return self.body(x) + self.shortcut(x)


def cnn_channels(arch: str, base: int, depth: int) -> list[int]:
    ratio = MAX_FILTERS / base
    if arch == "pyramid":
        g = ratio ** (1 / depth)
        return [min(int(base * g**i), MAX_FILTERS) for i in range(depth)]
    if arch == "gradual":
        g = ratio ** (1 / (2 * depth))
        return [min(int(base * g**i), MAX_FILTERS) for i in range(depth)]
    if arch == "uniform":
        return [base] * depth
    if arch == "bottleneck":
        g = 2 if depth <= 2 else ratio ** (1 / (depth - 1))
        return [2 * base] + [min(int(base * g ** (i - 1)), MAX_FILTERS) for i in range(1, depth)]
    if arch == "hourglass":
        c, e = depth // 2, depth - depth // 2
        up = ratio ** (1 / c) if c else 1.0
        down = ratio ** (1 / e)
        return [
            min(int(base * up**i), MAX_FILTERS) if i < c
            else max(int(base * down ** (depth - i - 1)), base)
            for i in range(depth)
        ]  # fmt: skip
    raise ValueError(f"unknown CNN arch {arch!r}")


def build_cnn(values, p, use_dropout, use_bn) -> tuple[nn.Module, tuple[int, ...], int]:
    cin, classes = int(values["input_channels"]), int(values["num_classes"])
    depth, arch, base = int(values["depth"]), values["arch"], int(values["base_filters"])
    size = int(values["input_size"])
    act = ACTIVATIONS[values.get("act", "relu")]
    layers: list[nn.Module] = []
    width = cin
    if arch == "residual":
        g = (MAX_FILTERS / base) ** (1 / depth)
        current = size
        for i in range(depth // 2):
            if current <= 7:
                break
            out = min(int(base * g**i), MAX_FILTERS)
            stride = 2 if i % 2 == 1 and current > 7 else 1
            layers.append(Residual(width, out, stride, act, use_bn, p, use_dropout))
            current = current // stride
            width = out
    elif arch == "dense":
        raise ValueError("arch dense needs the row's layer list (its transitions were random)")
    else:
        for out in cnn_channels(arch, base, depth):
            layers.append(ConvBlock(width, out, act, 1, use_bn, p, use_dropout))
            width = out
    head = [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes), nn.Softmax(dim=1)]
    return nn.Sequential(*layers, *head), (cin, size, size), classes


# --- Transformer ---


class TokenClassifier(nn.Module):
    def __init__(self, vocab, classes, emb, layers, heads, ff, p, seq):
        super().__init__()
        self.embedding = nn.Embedding(vocab, emb)
        self.position = nn.Parameter(torch.zeros(1, seq, emb))
        layer = nn.TransformerEncoderLayer(emb, heads, ff, p, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(emb, classes)

    def forward(self, ids):
        x = self.embedding(ids) + self.position
        return self.head(self.encoder(x).mean(dim=1))


def build_transformer(values) -> tuple[nn.Module, int, int, int, int]:
    seq, vocab = int(values["seq_length"]), int(values["input_size"])
    classes = int(values["num_classes"])
    model = TokenClassifier(
        vocab, classes, int(values["embedding_size"]), int(values["num_layers"]),
        int(values["num_heads"]), int(values["ff_hidden_size"]), float(values["dropout_rate"]),
        seq,
    )  # fmt: skip
    return model, seq, vocab, classes, int(values["num_samples"])


class RandomImages(Dataset):
    def __init__(self, shape, classes, length):
        self.shape, self.classes, self.length = shape, classes, length

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        return torch.randn(*self.shape), int(torch.randint(0, self.classes, ()))


def forever(loader: DataLoader, device: torch.device):
    for epoch in itertools.count():
        del epoch
        for x, y in loader:
            yield x.to(device), y.to(device)


def main() -> None:
    parser = base_parser(__doc__)
    parser.set_defaults(optimizer="adam", lr=1e-3)
    parser.add_argument("--config", required=True, help="a GPUMemNet row's Filename")
    parser.add_argument(
        "--num-workers",
        type=int,
        default=None,
        help="DataLoader workers (default: 0 for MLP, 2 for CNN/Transformer)",
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=None,
        help="dataset length (default: 4096 MLP, N Transformer, 64 batches CNN)",
    )
    args = parser.parse_args()
    try:
        pairs = parse_config(args.config)
        family = family_of(pairs)
        values, p, use_dropout, use_bn = _options(pairs)
    except ValueError as exc:
        parser.error(str(exc))
    device = setup(args)
    pin = args.device == "cuda"
    workers = args.num_workers if args.num_workers is not None else (0 if family == "mlp" else 2)
    loss = nn.CrossEntropyLoss()

    if family == "mlp":
        model, inp, out = build_mlp(values, p, use_dropout, use_bn)
        batch = int(values["batch"])
        n = args.samples or 4096
        data = TensorDataset(torch.randn(n, inp), torch.randint(0, max(out, 1), (n,)))
        model = model.to(device)
        model(torch.randn(2, inp, device=device))  # the model summary pass (batch 2, with grad)
    elif family == "cnn":
        try:
            model, shape, classes = build_cnn(values, p, use_dropout, use_bn)
        except ValueError as exc:
            parser.error(str(exc))
        batch = int(values["batch"])
        data = RandomImages(shape, classes, args.samples or 64 * batch)
        model = model.to(device)
    else:
        model, seq, vocab, classes, n = build_transformer(values)
        batch = int(values["batch_size"])
        n = args.samples or n
        data = TensorDataset(torch.randint(0, vocab, (n, seq)), torch.randint(0, classes, (n,)))
        model = model.to(device)
        warm = torch.randint(0, vocab, (batch, seq), device=device)
        model(warm)  # two train-mode forward passes (with grad) before training
        model(warm)
        del warm
    if args.grad_checkpointing:
        parser.error("--grad-checkpointing is not part of the GPUMemNet jobs")
    loader = DataLoader(
        data,
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        pin_memory=pin and family != "mlp",
    )

    def loss_fn(m, xy):
        return loss(m(xy[0]), xy[1])

    report(f"gpumemnet-{family}", train(model, None, loss_fn, args, forever(loader, device)))


if __name__ == "__main__":
    main()
