"""The broadcasting binary rule and the strided cat rule of capture/fast_layouts.py (issue 14,
branch w1) against the meta kernels (TensorIterator's output layout; cat's
compute_output_memory_format): thousands of seeded random calls, tensors of random shapes,
broadcasting, permutations, slices, steps, expansions, arbitrary (overlapping, zero) strides,
channels_last, storage offsets, mixed and 0-dim dtypes. Wherever a rule answers its outputs
are the kernel's (shape, strides, offset, dtype, storage size, view flag, sharing)."""

import random

import pytest
import torch

from peakmem.capture import fast_layouts
from peakmem.capture.fast_layouts import DECLINE, contiguous_strides, fast_layout

from .test_fast_layouts import check

aten = torch.ops.aten
FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
COMPUTED = [torch.float32, torch.float64, torch.float32]
CASES = 2500


def random_layout(rng: random.Random, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A meta tensor of `shape` in a random layout."""
    rank = len(shape)
    how = rng.choice(["contiguous", "contiguous", "permuted", "permuted", "expanded",
                      "narrowed", "stepped", "arbitrary", "channels_last", "size1", "offset"])
    if how == "permuted" and rank >= 2:
        order = list(range(rank))
        rng.shuffle(order)
        base = torch.empty([shape[d] for d in order], dtype=dtype, device="meta")
        inverse = [order.index(d) for d in range(rank)]
        return base.permute(inverse)
    if how == "expanded" and rank >= 1:
        small = tuple(1 if rng.random() < 0.5 else size for size in shape)
        return random_layout(rng, small, dtype).expand(shape) if small != shape else \
            torch.empty(shape, dtype=dtype, device="meta")
    if how == "narrowed" and rank >= 1:
        dim = rng.randrange(rank)
        extra = rng.randint(1, 3)
        wide = shape[:dim] + (shape[dim] + extra,) + shape[dim + 1:]
        return torch.empty(wide, dtype=dtype, device="meta").narrow(dim, extra, shape[dim])
    if how == "stepped" and rank >= 1:
        dim = rng.randrange(rank)
        wide = shape[:dim] + (2 * shape[dim],) + shape[dim + 1:]
        index = (slice(None),) * dim + (slice(None, None, 2),)
        return torch.empty(wide, dtype=dtype, device="meta")[index]
    if how == "arbitrary":
        strides = tuple(rng.choice([0, 1, 1, 2, 3, 4, 5, 8, 12, 20, 60]) for _ in shape)
        return torch.empty_strided(shape, strides, dtype=dtype, device="meta")
    if how == "channels_last" and rank in (4, 5):
        fmt = torch.channels_last if rank == 4 else torch.channels_last_3d
        return torch.empty(shape, dtype=dtype, device="meta").contiguous(memory_format=fmt)
    if how == "size1" and 1 in shape:
        strides = list(contiguous_strides(shape))
        strides[shape.index(1)] = rng.choice([0, 7, 1])
        return torch.empty_strided(shape, strides, dtype=dtype, device="meta")
    if how == "offset" and rank >= 1:
        big = torch.empty((shape[0] + 2,) + shape[1:], dtype=dtype, device="meta")
        return big[2:]
    return torch.empty(shape, dtype=dtype, device="meta")


def random_shape(rng: random.Random, rank: int) -> tuple:
    return tuple(rng.choice([1, 1, 2, 3, 4, 5]) for _ in range(rank))


def broadcast_operand(rng: random.Random, shape: tuple) -> tuple:
    """`shape` with some leading dimensions dropped and some sizes made 1."""
    kept = shape[rng.randint(0, len(shape)):] if rng.random() < 0.4 else shape
    return tuple(1 if rng.random() < 0.3 else size for size in kept)


def binary_case(rng: random.Random):
    shape = random_shape(rng, rng.randint(0, 5))
    shapes = [broadcast_operand(rng, shape) if rng.random() < 0.7 else shape for _ in range(2)]
    if rng.random() < 0.05:  # sizes that do not broadcast
        shapes[1] = tuple(size + 1 for size in shapes[1])
    dtype = rng.choice(COMPUTED if rng.random() < 0.9 else FLOATS)
    dtypes = [dtype, dtype]
    if rng.random() < 0.15:
        dtypes[rng.randrange(2)] = rng.choice(FLOATS + [torch.int64, torch.bool])
    a, b = (random_layout(rng, s, d) for s, d in zip(shapes, dtypes, strict=True))
    return a, b


@pytest.mark.parametrize("func", fast_layouts.BROADCAST_BINARY, ids=str)
def test_broadcasting_binary_answers_are_the_meta_kernels(func):
    rng = random.Random(14)
    answered = broadcast = permuted = 0
    for _ in range(CASES):
        a, b = binary_case(rng)
        kwargs = {}
        if func in (aten.add.Tensor, aten.sub.Tensor) and rng.random() < 0.2:
            kwargs["alpha"] = rng.choice([2, 0.5, -1])
        if check(func, (a, b), kwargs):
            answered += 1
            broadcast += a.shape != b.shape
            out = fast_layout(func, (a, b), kwargs)
            permuted += not out.is_contiguous()
    # the rule's case is met often: broadcasting and non-contiguous outputs included
    assert answered > CASES // 2 and broadcast > CASES // 4 and permuted > CASES // 20, (
        answered, broadcast, permuted)


def test_rotary_and_attention_shapes_are_answered_as_the_kernel():
    """x-transformers' rotary `t * cos` (a (b, h, n, d) query against (n, d) frequencies) and
    a transposed (b, n, h, d) -> (b, h, n, d) view against them."""
    t = torch.empty(2, 4, 7, 16, device="meta")
    cos = torch.empty(7, 16, device="meta")
    transposed = torch.empty(2, 7, 4, 16, device="meta").transpose(1, 2)
    for a, b in ((t, cos), (cos, t), (transposed, cos), (transposed, t),
                 (t[:, :, -1:], cos[-1:]), (t, torch.empty((), device="meta",
                                                           dtype=torch.float64))):
        assert check(aten.mul.Tensor, (a, b), {})
    out = fast_layout(aten.mul.Tensor, (transposed, cos), {})
    assert out.stride() == (448, 16, 64, 1)  # the transposed layout kept
    assert fast_layout(aten.add.Tensor, (t, cos), {"alpha": True}) is DECLINE
    assert fast_layout(aten.mul.Tensor, (t, torch.empty(6, 16, device="meta")),
                       {}) is DECLINE  # does not broadcast


def cat_case(rng: random.Random):
    rank = rng.randint(1, 5)
    shape = random_shape(rng, rank)
    dim = rng.randrange(rank)
    dtype = rng.choice(FLOATS + [torch.int64, torch.bool])
    tensors = []
    all_channels_last = rng.random() < 0.3  # (mostly: an input's other layout is drawn too)
    for _ in range(rng.randint(1, 4)):
        part = list(shape)
        part[dim] = rng.randint(1, 4)
        if rng.random() < 0.03:
            part[(dim + 1) % rank] += 1  # sizes that do not match
        odd = dtype if rng.random() > 0.03 else torch.float64
        if rank in (4, 5) and all_channels_last and rng.random() > 0.1:
            fmt = torch.channels_last if rank == 4 else torch.channels_last_3d
            part = torch.empty(part, dtype=odd, device="meta").contiguous(memory_format=fmt)
            tensors.append(part)
        else:
            tensors.append(random_layout(rng, tuple(part), odd))
    return tensors, (dim if rng.random() < 0.5 else dim - rank)


def test_cat_of_strided_inputs_answers_are_the_meta_kernels():
    rng = random.Random(140)
    answered = strided = channels_last = 0
    for _ in range(CASES):
        tensors, dim = cat_case(rng)
        if check(aten.cat.default, (tensors, dim), {}):
            answered += 1
            strided += not all(t.is_contiguous() for t in tensors)
            out = fast_layout(aten.cat.default, (tensors, dim), {})
            channels_last += not out.is_contiguous()
    assert answered > CASES // 2 and strided > CASES // 4 and channels_last >= 20, (
        answered, strided, channels_last)


def test_kv_cache_cat_of_transposed_keys_is_answered_as_the_kernel():
    """A key/value cache: (b, h, t, d) keys transposed from (b, t, h, d), concatenated along
    t; channels_last images concatenated along channels stay channels_last."""
    cache = torch.empty(2, 9, 4, 16, device="meta").transpose(1, 2)
    new = torch.empty(2, 1, 4, 16, device="meta").transpose(1, 2)
    assert check(aten.cat.default, ([cache, new], 2), {})
    assert fast_layout(aten.cat.default, ([cache, new], 2), {}).is_contiguous()
    image = torch.empty(2, 3, 5, 5, device="meta").contiguous(memory_format=torch.channels_last)
    assert check(aten.cat.default, ([image, image], 1), {})
    out = fast_layout(aten.cat.default, ([image, image], 1), {})
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    mixed = [image, torch.empty(2, 3, 5, 5, device="meta")]
    assert fast_layout(aten.cat.default, (mixed, 1), {}).is_contiguous()
    # an (N, 1, 1, 1) tensor of strides (W, W, W, W) is not taken for channels_last (c10's
    # ambiguity rule): with a channels_last input the output is contiguous
    sliced = torch.empty_strided((2, 1, 1, 1), (5, 5, 5, 5), device="meta")
    channels_last = torch.empty_strided((2, 2, 1, 1), (2, 1, 2, 2), device="meta")
    assert check(aten.cat.default, ([sliced, channels_last], 1), {})
    assert fast_layout(aten.cat.default, ([sliced, channels_last], 1), {}).stride() == (
        3, 1, 1, 1)
    assert fast_layout(aten.cat.default, ([cache, torch.empty(2, 4, 0, 16, device="meta")], 2),
                       {}) is DECLINE  # an empty input: the kernel's legacy rules


@pytest.mark.parametrize("func", fast_layouts.BROADCAST_BINARY, ids=str)
def test_tensor_and_number_answers_are_the_meta_kernels(func):
    """`t * 0.125`, `x + 0`, `positions - 0`: a strided tensor of any layout with a Python
    number (an int, a float, a bool; float, int and bool tensors)."""
    rng = random.Random(41)
    answered = strided = 0
    for _ in range(CASES // 2):
        shape = random_shape(rng, rng.randint(0, 5))
        dtype = rng.choice(COMPUTED + [torch.int64, torch.int32, torch.float16, torch.bool])
        x = random_layout(rng, shape, dtype)
        number = rng.choice([0.125, 1.0, 0, 2, -3, True])
        if check(func, (x, number), {}):
            answered += 1
            strided += not x.is_contiguous()
    assert answered > CASES // 8 and strided > CASES // 40, (answered, strided)


def test_stack_answers_are_the_meta_kernels():
    """stack of one shape in random layouts along every dimension (the cat of the inputs
    unsqueezed there; never a view)."""
    rng = random.Random(1401)
    answered = strided = 0
    for _ in range(CASES // 2):
        rank = rng.randint(0, 4)
        shape = random_shape(rng, rank)
        dtype = rng.choice(FLOATS + [torch.int64, torch.bool])
        tensors = [random_layout(rng, shape, dtype) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.05:
            tensors.append(random_layout(rng, shape + (2,), dtype))  # shapes that differ
        dim = rng.randint(-rank - 1, rank)
        if check(aten.stack.default, (tensors, dim), {}):
            answered += 1
            strided += not all(t.is_contiguous() for t in tensors)
    assert answered > CASES // 4 and strided > CASES // 10, (answered, strided)
