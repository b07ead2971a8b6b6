"""Parse a GPUMemNet row's `Filename` (the full launcher configuration) into a job description.

The grammar of each family is in ../shared/datasets/gpumemnet/README.md, "Rebuilding a row's job
exactly". Values may contain underscores (`act:leaky_relu`), so each family is matched by one
anchored regular expression instead of splitting on `_`.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

# launcher activation name -> torch.nn class name
ACTIVATIONS: dict[str, str] = {
    "relu": "ReLU",
    "leaky_relu": "LeakyReLU",
    "prelu": "PReLU",
    "elu": "ELU",
    "selu": "SELU",
    "tanh": "Tanh",
    "softplus": "Softplus",
    "swish": "SiLU",
    "mish": "Mish",
    "gelu": "GELU",
    "identity": "Identity",
}


class JobParseError(ValueError):
    """A `Filename` that does not follow the family's launcher grammar."""


@dataclass(frozen=True)
class MLPJob:
    input_size: int
    output_size: int
    depth: int
    arch: str  # pyramid | uniform | bottleneck | gradual
    batch_size: int
    activation: str = "relu"  # launcher name, see ACTIVATIONS
    dropout_p: float = 0.0
    dropout: bool = False
    batchnorm: bool = False
    softmax_head: bool = False  # step 2 only, and only when output_size > 1
    num_samples: int = 4096
    summary_batch: int = 2  # one forward pass at batch 2 before training (model summary)

    family = "mlp"


@dataclass(frozen=True)
class CNNJob:
    input_channels: int
    num_classes: int
    depth: int
    arch: str  # pyramid | gradual | uniform | bottleneck | hourglass | residual | dense
    base_filters: int
    batch_size: int
    input_size: int
    activation: str
    dropout_p: float
    dropout: bool
    batchnorm: bool
    # dense only: indices of the dense blocks followed by a transition, recovered from the row's
    # layer list; None when the row has no layer list (the job cannot be rebuilt exactly)
    dense_transitions: tuple[int, ...] | None = None
    # torchsummary's pass before training: `model(torch.rand(2, C, S, S))` on the GPU, with
    # grad (the sample14 rows carry its "Input/Forward-Backward/Params/Estimated Total Size")
    summary_batch: int = 2

    family = "cnn"


@dataclass(frozen=True)
class TransformerJob:
    num_classes: int
    embedding_size: int
    num_layers: int
    num_heads: int
    ff_hidden_size: int
    dropout_rate: float
    seq_length: int
    vocab_size: int  # `input_size` in the launcher
    num_samples: int
    batch_size: int
    summary_passes: int = 2  # two train-mode forward passes on a (B, S) batch before training

    family = "transformer"


GpuMemNetJob = MLPJob | CNNJob | TransformerJob

_FLOAT = r"[0-9.eE+-]+"
_BOOL = r"True|False"

_MLP_RE = re.compile(
    r"^input:(?P<input>\d+)_output:(?P<output>\d+)_depth:(?P<depth>\d+)_arch:(?P<arch>[a-z]+)"
    r"_batch:(?P<batch>\d+)"
    rf"(?:_act:(?P<act>[a-z_]+)_dropout:(?P<p>{_FLOAT})_dropout:(?P<use_dropout>{_BOOL})"
    rf"_batchnorm:(?P<bn>{_BOOL}))?(?:\.out)?$"
)
_CNN_RE = re.compile(
    r"^input_channels:(?P<c>\d+)_num_classes:(?P<k>\d+)_depth:(?P<depth>\d+)_arch:(?P<arch>[a-z]+)"
    r"_base_filters:(?P<f>\d+)_batch:(?P<batch>\d+)_input_size:(?P<s>\d+)_act:(?P<act>[a-z_]+)"
    rf"_dropout:(?P<p>{_FLOAT})_dropout:(?P<use_dropout>{_BOOL})_batchnorm:(?P<bn>{_BOOL})"
    r"(?:\.out)?$"
)
_TRANSFORMER_RE = re.compile(
    r"^num_classes:(?P<k>\d+)_embedding_size:(?P<e>\d+)_num_layers:(?P<l>\d+)"
    r"_num_heads:(?P<h>\d+)_ff_hidden_size:(?P<ff>\d+)_dropout_rate:(?P<p>" + _FLOAT + r")"
    r"_seq_length:(?P<s>\d+)_input_size:(?P<v>\d+)_num_samples:(?P<n>\d+)"
    r"_batch_size:(?P<b>\d+)(?:\.out)?$"
)

MLP_ARCHS = ("pyramid", "uniform", "bottleneck", "gradual")
CNN_ARCHS = ("pyramid", "gradual", "uniform", "bottleneck", "hourglass", "residual", "dense")


def _activation(name: str, filename: str) -> str:
    if name not in ACTIVATIONS:
        raise JobParseError(f"unknown activation {name!r} in {filename!r}")
    return name


def parse_mlp(filename: str) -> MLPJob:
    m = _MLP_RE.match(filename)
    if m is None or m["arch"] not in MLP_ARCHS:
        raise JobParseError(f"not an MLP launcher configuration: {filename!r}")
    output = int(m["output"])
    if m["act"] is None:  # step 1: Linear -> ReLU, no softmax
        return MLPJob(int(m["input"]), output, int(m["depth"]), m["arch"], int(m["batch"]))
    return MLPJob(
        int(m["input"]),
        output,
        int(m["depth"]),
        m["arch"],
        int(m["batch"]),
        activation=_activation(m["act"], filename),
        dropout_p=float(m["p"]),
        dropout=m["use_dropout"] == "True",
        batchnorm=m["bn"] == "True",
        softmax_head=output > 1,
    )


def parse_cnn(filename: str, layer_list: str | None = None) -> CNNJob:
    m = _CNN_RE.match(filename)
    if m is None or m["arch"] not in CNN_ARCHS:
        raise JobParseError(f"not a CNN launcher configuration: {filename!r}")
    depth = int(m["depth"])
    transitions = None
    if m["arch"] == "dense" and layer_list:
        transitions = dense_transitions_from_layers(
            parse_layer_list(layer_list), int(m["c"]), depth
        )
    return CNNJob(
        input_channels=int(m["c"]),
        num_classes=int(m["k"]),
        depth=depth,
        arch=m["arch"],
        base_filters=int(m["f"]),
        batch_size=int(m["batch"]),
        input_size=int(m["s"]),
        activation=_activation(m["act"], filename),
        dropout_p=float(m["p"]),
        dropout=m["use_dropout"] == "True",
        batchnorm=m["bn"] == "True",
        dense_transitions=transitions,
    )


def parse_transformer(filename: str) -> TransformerJob:
    m = _TRANSFORMER_RE.match(filename)
    if m is None:
        raise JobParseError(f"not a Transformer launcher configuration: {filename!r}")
    return TransformerJob(
        num_classes=int(m["k"]),
        embedding_size=int(m["e"]),
        num_layers=int(m["l"]),
        num_heads=int(m["h"]),
        ff_hidden_size=int(m["ff"]),
        dropout_rate=float(m["p"]),
        seq_length=int(m["s"]),
        vocab_size=int(m["v"]),
        num_samples=int(m["n"]),
        batch_size=int(m["b"]),
    )


def parse_job(filename: str, layer_list: str | None = None) -> GpuMemNetJob:
    """Any GPUMemNet `Filename`, dispatched on its first key (input / input_channels /
    num_classes); `layer_list` is the row's `Activations-Params` (needed for dense CNNs)."""
    if filename.startswith("input_channels:"):
        return parse_cnn(filename, layer_list)
    if filename.startswith("input:"):
        return parse_mlp(filename)
    if filename.startswith("num_classes:"):
        return parse_transformer(filename)
    raise JobParseError(f"not a GPUMemNet launcher configuration: {filename!r}")


MAX_LAYER_LIST_CHARS = 1 << 20


def parse_layer_list(text: str) -> list[tuple[str, int, int]]:
    """The `Activations-Params` column: [(layer kind, per-sample output elements, params), ...]."""
    if len(text) > MAX_LAYER_LIST_CHARS:
        raise JobParseError(f"layer list of {len(text)} characters (at most {MAX_LAYER_LIST_CHARS})")
    try:
        layers = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise JobParseError(f"unreadable layer list: {text[:60]!r}") from exc
    if not isinstance(layers, (list, tuple)):
        raise JobParseError(f"unreadable layer list: {text[:60]!r}")
    parsed = []
    for layer in layers:
        if (
            not isinstance(layer, (list, tuple))
            or len(layer) != 3
            or not isinstance(layer[0], str)
            or not all(
                isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**63
                for n in layer[1:]
            )
        ):
            raise JobParseError(f"unreadable layer list entry in {text[:60]!r}")
        parsed.append((layer[0], layer[1], layer[2]))
    return parsed


DENSE_GROWTH = 32


def dense_transitions_from_layers(
    layers: list[tuple[str, int, int]], input_channels: int, depth: int
) -> tuple[int, ...]:
    """Recover which dense blocks were followed by a transition.

    Walks the conv layers tracking the channel count: a dense-layer conv is 3x3 with
    `in*9*32 + 32` parameters and adds 32 channels; a transition is a 1x1 conv with
    `in*(in//2) + in//2` parameters that halves the channels. A transition seen after the
    k-th group of 4 dense convs means block k-1 has one.
    """
    channels = input_channels
    dense_convs = 0
    transitions: list[int] = []
    for kind, _numel, params in layers:
        if kind != "conv2d":
            continue
        dense_params = channels * 9 * DENSE_GROWTH + DENSE_GROWTH
        half = channels // 2
        transition_params = channels * half + half
        if params == dense_params and params != transition_params:
            channels += DENSE_GROWTH
            dense_convs += 1
        elif params == transition_params:
            if dense_convs == 0 or dense_convs % 4:
                raise JobParseError("dense layer list: transition inside a dense block")
            transitions.append(dense_convs // 4 - 1)
            channels = half
        else:
            raise JobParseError(
                f"dense layer list: conv with {params} params fits neither a dense layer "
                f"nor a transition at {channels} channels"
            )
    if dense_convs != (depth // 4) * 4:
        raise JobParseError(
            f"dense layer list has {dense_convs} dense convs, expected {(depth // 4) * 4}"
        )
    return tuple(transitions)
