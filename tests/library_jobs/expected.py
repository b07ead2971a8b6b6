"""Device bytes the library jobs' parameters must take, worked out from their configs.

Every parameter is its own allocation, which the caching allocator rounds up to 512 bytes, and
an estimate's breakdown counts blocks as the allocator rounds them (estimate/breakdown.py):
`device_bytes` sums the rounded size of each tensor. Shapes are listed by hand from each
library's layer definitions; none of this asks peakmem or imports the libraries.
"""

from __future__ import annotations

from collections.abc import Iterable
from math import prod

Shape = tuple[int, ...]

FP32, BF16 = 4, 2
BLOCK = 512


def rounded(nbytes: int) -> int:
    return max(BLOCK, -(-nbytes // BLOCK) * BLOCK)


def device_bytes(shapes: Iterable[Shape], itemsize: int) -> int:
    """Device memory of one allocation per tensor of these shapes, as the allocator rounds it."""
    return sum(rounded(prod(shape) * itemsize) for shape in shapes)


def linear(d_out: int, d_in: int, bias: bool = True) -> list[Shape]:
    return [(d_out, d_in), (d_out,)] if bias else [(d_out, d_in)]


def gpt2_shapes(vocab: int, positions: int, embd: int, layers: int, tied: bool = True) -> list[Shape]:
    """GPT-2 (transformers' GPT2LMHeadModel and nanoGPT / minGPT, biases on): the tied
    lm_head is the token embedding, one tensor (counted once)."""
    shapes: list[Shape] = [(vocab, embd), (positions, embd)]
    for _ in range(layers):
        shapes += [(embd,), (embd,)]  # ln_1
        shapes += linear(3 * embd, embd)  # c_attn (Conv1D or Linear: same sizes)
        shapes += linear(embd, embd)  # attn c_proj
        shapes += [(embd,), (embd,)]  # ln_2
        shapes += linear(4 * embd, embd)  # c_fc
        shapes += linear(embd, 4 * embd)  # mlp c_proj
    shapes += [(embd,), (embd,)]  # ln_f
    if not tied:
        shapes.append((vocab, embd))  # lm_head, no bias
    return shapes


TINY_GPT2 = dict(vocab=256, positions=64, embd=64, layers=2)
"""hf_causal_lm_loop.py and hf_trainer.py (GPT2Config n_layer=2, n_embd=64, vocab 256, 64 pos)."""

NANOGPT = dict(vocab=512, positions=64, embd=64, layers=2)
"""nanogpt_train.py's defaults (bias=True, tied wte / lm_head)."""

MINGPT = dict(vocab=96, positions=32, embd=64, layers=2)
"""mingpt_trainer.py (untied lm_head)."""

TINY_LLAMA = dict(vocab=320, hidden=64, intermediate=176, layers=2, heads=4, kv_heads=2)
"""make_llama_checkpoint.py and peft_lora.py (untied lm_head)."""


def llama_shapes(vocab: int, hidden: int, intermediate: int, layers: int, heads: int,
                 kv_heads: int) -> list[Shape]:
    head_dim = hidden // heads
    shapes: list[Shape] = [(vocab, hidden)]
    for _ in range(layers):
        shapes += [(hidden, hidden), (kv_heads * head_dim, hidden), (kv_heads * head_dim, hidden)]
        shapes += [(hidden, hidden)]  # o_proj
        shapes += [(intermediate, hidden), (intermediate, hidden), (hidden, intermediate)]
        shapes += [(hidden,), (hidden,)]  # input / post-attention RMSNorm
    shapes += [(hidden,), (vocab, hidden)]  # final norm, lm_head
    return shapes


def lora_shapes(rank: int, hidden: int, heads: int, kv_heads: int, layers: int,
                **_: int) -> list[Shape]:
    """LoRA A (r x in) and B (out x r) on q_proj and v_proj of each layer."""
    kv_out = kv_heads * (hidden // heads)
    per_layer = [(rank, hidden), (hidden, rank), (rank, hidden), (kv_out, rank)]
    return per_layer * layers


def mlp3_shapes(d_in: int = 128, hidden: int = 512, classes: int = 10) -> list[Shape]:
    """The accelerate / Fabric / Lightning jobs' three Linear layers."""
    return linear(hidden, d_in) + linear(hidden, hidden) + linear(classes, hidden)


def mnist_cnn_shapes() -> list[Shape]:
    """pytorch/examples mnist Net."""
    return [(32, 1, 3, 3), (32,), (64, 32, 3, 3), (64,), *linear(128, 9216), *linear(10, 128)]


def litgpt_shapes(vocab: int = 512, dim: int = 128, layers: int = 2, hidden: int = 352) -> list[Shape]:
    shapes: list[Shape] = [(vocab, dim)]
    for _ in range(layers):
        shapes += [(dim,), (3 * dim, dim), (dim, dim), (dim,), (hidden, dim), (hidden, dim),
                   (dim, hidden)]
    return shapes + [(dim,), (vocab, dim)]


def resnet18_shapes(classes: int = 10) -> tuple[list[Shape], list[Shape]]:
    """ResNet-18 (torchvision and timm build the same tensors): (parameters, BatchNorm buffers).

    Buffers per BatchNorm: running_mean, running_var (fp32) and num_batches_tracked (int64,
    0-d): the last is listed as () and costs one 512-byte block like the others."""
    params: list[Shape] = [(64, 3, 7, 7)]
    bns = [64]
    in_ch = 64
    for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for block in range(2):
            params += [(width, in_ch if block == 0 else width, 3, 3), (width, width, 3, 3)]
            bns += [width, width]
            if block == 0 and (stride != 1 or in_ch != width):
                params.append((width, in_ch, 1, 1))
                bns.append(width)
        in_ch = width
    for channels in bns:
        params += [(channels,), (channels,)]
    params += linear(classes, 512)
    buffers: list[Shape] = []
    for channels in bns:
        buffers += [(channels,), (channels,), ()]
    return params, buffers


def count(shapes: Iterable[Shape]) -> int:
    return sum(prod(shape) for shape in shapes)


# pytorch/examples re-creations (scripts/examples_*.py) ---------------------------------------

def conv(c_out: int, c_in: int, k: int, bias: bool = True) -> list[Shape]:
    return [(c_out, c_in, k, k), (c_out,)] if bias else [(c_out, c_in, k, k)]


def conv_transpose(c_in: int, c_out: int, k: int) -> list[Shape]:
    """ConvTranspose2d's weight is (in, out, k, k); dcgan's have no bias."""
    return [(c_in, c_out, k, k)]


def norm(channels: int) -> list[Shape]:
    """BatchNorm / LayerNorm affine weight and bias."""
    return [(channels,), (channels,)]


def lstm_shapes(d_in: int, hidden: int, layers: int) -> list[Shape]:
    """nn.LSTM / nn.LSTMCell per layer: weight_ih (4h, in), weight_hh (4h, h), two biases (4h)."""
    shapes: list[Shape] = []
    for layer in range(layers):
        shapes += [(4 * hidden, d_in if layer == 0 else hidden), (4 * hidden, hidden),
                   (4 * hidden,), (4 * hidden,)]
    return shapes


def word_lm_lstm_shapes(ntokens: int, emsize: int, nhid: int, nlayers: int) -> list[Shape]:
    """word_language_model RNNModel("LSTM"), untied."""
    return [(ntokens, emsize), *lstm_shapes(emsize, nhid, nlayers), *linear(ntokens, nhid)]


def _attention(d: int) -> list[Shape]:
    return [(3 * d, d), (3 * d,), *linear(d, d)]  # in_proj weight / bias, out_proj


def word_lm_transformer_shapes(ntokens: int, d: int, ff: int, nlayers: int) -> list[Shape]:
    """word_language_model TransformerModel(nn.Transformer): the encoder layers and norm, the
    input embedding and `self.decoder = nn.Linear(...)`, which replaces nn.Transformer's own
    decoder (its layers are dropped before the model is moved)."""
    encoder = _attention(d) + linear(ff, d) + linear(d, ff) + norm(d) + norm(d)
    return nlayers * encoder + norm(d) + [(ntokens, d)] + linear(ntokens, d)


def dcgan_shapes(nz: int, ngf: int, ndf: int, nc: int = 3) -> tuple[list[Shape], list[Shape]]:
    """dcgan Generator + Discriminator at 64x64: (parameters, BatchNorm buffers)."""
    g = conv_transpose(nz, ngf * 8, 4) + norm(ngf * 8)
    g += conv_transpose(ngf * 8, ngf * 4, 4) + norm(ngf * 4)
    g += conv_transpose(ngf * 4, ngf * 2, 4) + norm(ngf * 2)
    g += conv_transpose(ngf * 2, ngf, 4) + norm(ngf)
    g += conv_transpose(ngf, nc, 4)
    d = conv(ndf, nc, 4, bias=False)
    d += conv(ndf * 2, ndf, 4, bias=False) + norm(ndf * 2)
    d += conv(ndf * 4, ndf * 2, 4, bias=False) + norm(ndf * 4)
    d += conv(ndf * 8, ndf * 4, 4, bias=False) + norm(ndf * 8)
    d += conv(1, ndf * 8, 4, bias=False)
    buffers: list[Shape] = []
    for channels in (ngf * 8, ngf * 4, ngf * 2, ngf, ndf * 2, ndf * 4, ndf * 8):
        buffers += [(channels,), (channels,), ()]
    return g + d, buffers


def vae_shapes() -> list[Shape]:
    return linear(400, 784) + linear(20, 400) + linear(20, 400) + linear(400, 20) + linear(784, 400)


def espcn_shapes(upscale: int) -> list[Shape]:
    """super_resolution Net."""
    return conv(64, 1, 5) + conv(64, 64, 3) + conv(32, 64, 3) + conv(upscale**2, 32, 3)


def hogwild_net_shapes() -> list[Shape]:
    return conv(10, 1, 5) + conv(20, 10, 5) + linear(50, 320) + linear(10, 50)


def sine_lstm_shapes() -> list[Shape]:
    """time_sequence_prediction Sequence: LSTMCell(1, 51), LSTMCell(51, 51), Linear(51, 1)."""
    return lstm_shapes(1, 51, 1) + lstm_shapes(51, 51, 1) + linear(1, 51)


def _double_conv(c_in: int, c_out: int) -> tuple[list[Shape], list[int]]:
    return conv(c_out, c_in, 3, bias=False) + norm(c_out) + conv(c_out, c_out, 3, bias=False) + norm(c_out), [c_out, c_out]


def unet_shapes(base: int, channels: int = 3, classes: int = 2) -> tuple[list[Shape], list[Shape]]:
    """milesial Pytorch-UNet UNet(bilinear=False): (parameters, BatchNorm buffers)."""
    widths = [base, base * 2, base * 4, base * 8, base * 16]
    params, bn = _double_conv(channels, base)
    for c_in, c_out in zip(widths[:-1], widths[1:], strict=True):  # Down: maxpool + DoubleConv
        shapes, norms = _double_conv(c_in, c_out)
        params, bn = params + shapes, bn + norms
    for c_in, c_out in zip(widths[:0:-1], widths[-2::-1], strict=True):  # Up: ConvTranspose2d + DoubleConv
        params += [(c_in, c_in // 2, 2, 2), (c_in // 2,)]
        shapes, norms = _double_conv(c_in, c_out)
        params, bn = params + shapes, bn + norms
    params += conv(classes, base, 1)
    buffers: list[Shape] = []
    for c in bn:
        buffers += [(c,), (c,), ()]
    return params, buffers


def _res_block(d_in: int, d_out: int, time_dim: int) -> list[Shape]:
    shapes = linear(2 * d_out, time_dim) + conv(d_out, d_in, 3) + norm(d_out)
    shapes += conv(d_out, d_out, 3) + norm(d_out)
    return shapes + (conv(d_out, d_in, 1) if d_in != d_out else [])


def ddpm_unet_shapes(dim: int, channels: int = 3) -> list[Shape]:
    """ddpm_ema_train.py's Unet with dim_mults (1, 2)."""
    td = 4 * dim
    shapes = linear(td, dim) + linear(td, td) + conv(dim, channels, 7)
    shapes += _res_block(dim, dim, td) + conv(dim, dim, 4)
    shapes += _res_block(dim, 2 * dim, td) + conv(2 * dim, 2 * dim, 4)
    shapes += _res_block(2 * dim, 2 * dim, td)
    shapes += [(2 * dim, 2 * dim, 4, 4), (2 * dim,)] + _res_block(4 * dim, dim, td)
    shapes += [(dim, dim, 4, 4), (dim,)] + _res_block(2 * dim, dim, td)
    return shapes + conv(channels, dim, 1)


def cyclegan_shapes(ngf: int, ndf: int, n_blocks: int) -> list[Shape]:
    """cyclegan_train.py: two ResnetGenerators (InstanceNorm without affine: no weights) and two
    3-layer PatchGAN discriminators, all convolutions with bias."""
    g = conv(ngf, 3, 7) + conv(2 * ngf, ngf, 3) + conv(4 * ngf, 2 * ngf, 3)
    g += n_blocks * (conv(4 * ngf, 4 * ngf, 3) + conv(4 * ngf, 4 * ngf, 3))
    g += [(4 * ngf, 2 * ngf, 3, 3), (2 * ngf,), (2 * ngf, ngf, 3, 3), (ngf,)]  # ConvTranspose2d
    g += conv(3, ngf, 7)
    d = conv(ndf, 3, 4) + conv(2 * ndf, ndf, 4) + conv(4 * ndf, 2 * ndf, 4)
    d += conv(8 * ndf, 4 * ndf, 4) + conv(1, 8 * ndf, 4)
    return 2 * g + 2 * d
