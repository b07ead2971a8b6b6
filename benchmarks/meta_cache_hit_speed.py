"""CPU microseconds of a meta cache hit (`MetaCache.call_entry`) on calls a CNN row makes, best
of 7 rounds (issue 14).

    python benchmarks/meta_cache_hit_speed.py

Meta tensors, torch functions disabled as in the recorder's dispatch; each call is made once
(a miss: its entry kept), then timed as a hit. Run it with each source tree's `src` on
PYTHONPATH, alternately, to compare two trees. A call the cache does not keep (an op with a
fused kernel of peakmem's registered: convolution) is listed and left out.
"""

from __future__ import annotations

import time
import timeit

import torch

from peakmem.capture.meta_cache import MetaCache

aten = torch.ops.aten


def meta(*shape, **kwargs):
    return torch.empty(*shape, device="meta", **kwargs)


def calls() -> list[tuple]:
    x = meta(64, 32, 16, 16)
    weight, bias = meta(64, 32, 3, 3, requires_grad=True), meta(64, requires_grad=True)
    params = [meta(64, 32, 3, 3) for _ in range(10)] + [meta(64) for _ in range(10)]
    grads = [torch.empty_like(p) for p in params]
    return [
        (aten.convolution.default, (x, weight, bias, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
         {}),
        (aten.relu.default, (x,), {}),
        (aten.add.Tensor, (x, x), {}),
        (aten.threshold_backward.default, (x, x, 0), {}),
        (aten.native_batch_norm.default, (x, meta(32), meta(32), meta(32), meta(32), True, 0.1,
                                          1e-5), {}),
        (aten.mm.default, (meta(64, 128), meta(128, 10)), {}),
        (aten._foreach_add_.Scalar, (params, 1.5), {}),
        (aten._foreach_mul.Scalar, (grads, 0.9), {}),
        (aten.sum.dim_IntList, (x, [0, 2, 3]), {}),
        (aten.empty_like.default, (x,), {"memory_format": torch.preserve_format}),
        # nn.Conv2d's weight as the recorder sees it
        (aten.empty.memory_format, ([64, 3, 3, 3],), {"device": torch.device("meta"),
                                                      "pin_memory": False}),
    ]


def main() -> None:
    cache = MetaCache()
    with torch._C.DisableTorchFunction():
        kept = []
        for func, args, kwargs in calls():
            if cache.call_entry(func, args, kwargs)[1] is None:
                print(f"not cached: {func}")
            else:
                kept.append((func, args, kwargs))

        def every_call() -> None:
            for func, args, kwargs in kept:
                cache.call_entry(func, args, kwargs)

        rounds = 3000
        best = min(timeit.repeat(every_call, number=rounds, repeat=7, timer=time.process_time))
        print(f"mean of {len(kept)} calls: {best / rounds / len(kept) * 1e6:.2f} us per hit")
        for func, args, kwargs in kept:
            seconds = min(timeit.repeat(lambda f=func, a=args, k=kwargs: cache.call_entry(f, a, k),
                                        number=2000, repeat=7, timer=time.process_time))
            print(f"  {str(func):34s} {seconds / 2000 * 1e6:.2f} us")


if __name__ == "__main__":
    main()
