"""Library calls that move or read fake device tensors on the host (capture/device_map.py,
capture/slice_bounds.py): a module moved back to the host by keyword (timm's
`ModelEmaV3(device="cpu")`), `torch.allclose` / `torch.equal` (torchmetrics' compute groups),
slices bounded by device scalars (torchmetrics' `gather_all_tensors`)."""

import torch

from peakmem.capture import capture_callable
from peakmem.trace.events import EventKind
from tests.capture.capture_helpers import allocations


def run(job, a100, stack24, mode="fake"):
    result = capture_callable(job, gpu=a100, stack=stack24, steps="all", mode=mode)
    assert result.error is None, result.error_text
    return result


def test_a_module_moved_back_to_the_host_by_keyword_leaves_the_device(a100, stack24):
    # timm's ModelEmaV3(model, device="cpu") (train.py --model-ema-force-cpu): a deep copy of
    # the device model, then `.to(device="cpu")`, whose `convert` calls
    # `t.to(device, None, non_blocking)` on each tensor
    import copy

    seen = {}

    def job():
        model = torch.nn.Linear(256, 1024).cuda()
        ema = copy.deepcopy(model).to(device="cpu")
        seen["ema"] = {p.device.type for p in ema.parameters()}
        seen["positional"] = model.weight.to(torch.device("cpu"), None, False).device.type
        seen["out"] = model(torch.randn(4, 256, device="cuda")).shape

    result = run(job, a100, stack24)
    assert seen == {"ema": {"cpu"}, "positional": "cpu", "out": torch.Size([4, 1024])}
    weights = 1024 * 256 * 4
    # the model's weight, then the copy's, freed when the copy moved to the host
    made = [tag.op for size, tag in allocations(result.trace) if size == weights
            and tag.category != "workspace"]
    assert made == ["_to_copy.default", "clone.default"]
    live = {}
    for index, (kind, ident, _size, _stream, _tag) in enumerate(result.trace.events()):
        if kind == EventKind.ALLOC:
            live[ident] = result.trace.tag_of(index).op
        elif kind == EventKind.FREE:
            live.pop(ident, None)
    assert "clone.default" not in live.values()  # the copy left the device


def test_allclose_and_equal_of_device_tensors_are_host_reads(a100, stack24):
    # torchmetrics' MetricCollection merges metrics whose states are `allclose` after the first
    # update (compute groups)
    seen = {}

    def job():
        a = torch.empty(8, device="cuda")  # no known values (zeros' are: capture.known_values)
        b = torch.empty(8, device="cuda")
        seen["allclose"] = torch.allclose(a, b) and a.allclose(b, atol=1e-6)
        seen["equal"] = torch.equal(a, b) and a.equal(b)

    result = run(job, a100, stack24)
    assert seen == {"allclose": True, "equal": True}  # fake mode reads zeros
    assert result.host_reads == 8  # each tensor read on the host, per call


def test_a_slice_bounded_by_device_scalars_reads_them_on_the_host(a100, stack24):
    # torchmetrics' gather_all_tensors: `gathered[idx][[slice(d) for d in item_size]]` with
    # sizes that are device tensors (Python's slice parser reads them from C++)
    seen = {}

    def job():
        x = torch.randn(8, 4, device="cuda")
        sizes = torch.tensor([5, 3], device="cuda")  # built from host data: its values known
        seen["get"] = x[tuple(slice(d) for d in sizes)].shape
        seen["colon"] = x[: sizes[1]].shape
        x[sizes[1]:] = 0.0
        seen["unknown"] = x[: torch.zeros(1, device="cuda").long()[0]].shape  # fake: zeros

    result = run(job, a100, stack24)
    assert seen == {"get": torch.Size([5, 3]), "colon": torch.Size([3, 4]),
                    "unknown": torch.Size([0, 4])}
    assert result.error is None


def test_a_zero_dim_device_index_is_read_on_the_host_as_cuda_indexing_reads_it(a100, stack24):
    # torch's indexing reads a 0-d integer tensor index with `item()` (a select) and a 0-d bool
    # one with `item<bool>()` (a bool index): timm's Kron picks a row with `A[j]`, `j` from
    # `torch.max(x, 0)`; torchmetrics' R2Score writes `raw_scores[cond] = ...`, `cond` 0-d bool
    seen = {}

    def job():
        a = torch.randn(6, 6, device="cuda")
        _, j = torch.max(a.sum(dim=1), 0)
        seen["row"] = a[j].shape
        seen["column"] = a[:, j].shape
        seen["known"] = a[torch.tensor(2, device="cuda")].shape  # built from host data
        cond = ~torch.isclose(a.sum(), torch.zeros((), device="cuda"))
        scores = torch.ones((), device="cuda")
        seen["mask"] = scores[cond].shape
        scores[cond] = 1 - scores[cond]
        seen["uint8"] = a[torch.tensor(1, dtype=torch.uint8, device="cuda")].shape

    result = run(job, a100, stack24)
    # fake mode reads zeros: index 0, the masks False (an empty selection)
    assert seen == {"row": torch.Size([6]), "column": torch.Size([6]), "known": torch.Size([6]),
                    "mask": torch.Size([0]), "uint8": torch.Size([1, 6, 6])}
    assert result.host_reads == 5  # j twice, cond three times (those built from host data known)

    eager = run(job, a100, stack24, mode="eager")
    assert seen["mask"] == torch.Size([1])  # the real values: the sum is not 0
    assert eager.error is None
