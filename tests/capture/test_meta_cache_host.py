"""Host factories and copies through the meta cache (branch s1): run as the kernel, never
keyed or cached, the same values as the op called directly."""

import torch

from peakmem.capture.meta_cache import MetaCache

aten = torch.ops.aten
HOST = torch.device("cpu")


def test_host_factories_run_the_kernel_and_are_not_counted():
    cache = MetaCache()
    torch.manual_seed(3)
    made = [cache.call(aten.randint.low, (0, 9, [5]), {"device": HOST, "pin_memory": False}),
            cache.call(aten.randn.default, ([2, 3],), {"device": HOST}),
            cache.call(aten.zeros.default, ([4],), {"dtype": torch.int64, "device": HOST})]
    torch.manual_seed(3)
    direct = [aten.randint.low(0, 9, [5], device=HOST, pin_memory=False),
              aten.randn.default([2, 3], device=HOST),
              aten.zeros.default([4], dtype=torch.int64, device=HOST)]
    for ours, theirs in zip(made, direct, strict=True):
        assert ours.device == HOST and torch.equal(ours, theirs)
    assert (cache.hits, cache.misses) == (0, 0)
    # the meta device's factories are still keyed: a miss, then a hit
    for _ in range(2):
        out = cache.call(aten.zeros.default, ([4, 2],), {"device": torch.device("meta")})
        assert out.is_meta and out.shape == (4, 2)
    assert (cache.hits, cache.misses) == (1, 1)


def test_a_copy_to_the_host_is_the_kernels():
    cache = MetaCache()
    source = torch.arange(6.0).reshape(2, 3)
    out = cache.call(aten._to_copy.default, (source,), {"dtype": torch.float64, "device": HOST})
    assert out.dtype == torch.float64 and torch.equal(out, source.double())
    assert cache.misses == 0


def test_unsafe_view_runs_its_kernel_unkeyed_and_stays_a_view():
    """_unsafe_view's output shares its input's storage (never cacheable): it runs its
    kernel without a key, the same view every call, neither a hit nor a miss."""
    cache = MetaCache()
    source = torch.empty(4, 6, device="meta")
    for _ in range(2):
        out = cache.call(aten._unsafe_view.default, (source, [2, 12]), {})
        assert out.shape == (2, 12) and out.stride() == (12, 1)
        assert out.untyped_storage()._cdata == source.untyped_storage()._cdata
    assert (cache.hits, cache.misses) == (0, 0)
