"""Known host values carried through cheap ops on small device tensors in fake mode
(capture/known_values.py): PyG's `int(mask.sum())`, torchmetrics' `len(torch.unique(target))`,
`.tolist()` of an arange-derived tensor, boolean selections sized by a known mask."""

import torch

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations


def run(job, a100, stack24, mode="fake"):
    result = capture_callable(job, gpu=a100, stack=stack24, steps="all", mode=mode)
    assert result.error is None, result.error_text
    assert result.mode == mode
    return result


def test_elementwise_ops_and_reductions_of_known_tensors_keep_their_values(a100, stack24):
    seen = {}

    def job():
        index = torch.arange(10).cuda()
        mask = (index >= 3) & (index < 7)
        seen["sum"] = int(mask.sum())
        seen["cumsum"] = torch.cumsum(index, 0)[-1].item()
        seen["where"] = torch.where(mask, index * 2, -1).tolist()
        seen["arange"] = (torch.arange(4, device="cuda") + 1).tolist()
        labels = torch.tensor([3, 1, 3, 0, 1], device="cuda")
        seen["unique"] = len(torch.unique(labels))
        seen["argmax"] = int(labels.argmax())
        seen["gathered"] = labels[torch.tensor([0, 3], device="cuda")].tolist()

    run(job, a100, stack24)
    assert seen == {"sum": 4, "cumsum": 45, "where": [-1, -1, -1, 6, 8, 10, 12, -1, -1, -1],
                    "arange": [1, 2, 3, 4], "unique": 3, "argmax": 0, "gathered": [3, 0]}


def test_a_value_from_an_unknown_tensor_stays_a_placeholder(a100, stack24):
    seen = {}

    def job():
        known = torch.ones(5, device="cuda")
        unknown = torch.randn(5, device="cuda")  # random: no host values
        seen["mixed"] = (known + unknown).tolist()
        weight = torch.nn.Parameter(torch.ones(5, device="cuda"))
        seen["grad_input"] = (weight * 2).detach().tolist()  # an input that needs grad

    run(job, a100, stack24)
    assert seen == {"mixed": [0.0] * 5, "grad_input": [0.0] * 5}


def test_in_place_writes_to_a_known_tensor_are_followed(a100, stack24):
    seen = {}

    def job():
        counts = torch.zeros(3, dtype=torch.long, device="cuda")
        counts.add_(torch.tensor([1, 2, 3], device="cuda"))
        counts += 1
        seen["counts"] = counts.tolist()
        counts.normal_() if counts.is_floating_point() else counts.random_(5)  # not carried
        seen["after_random"] = counts.tolist()

    run(job, a100, stack24)
    assert seen == {"counts": [2, 3, 4], "after_random": [0, 0, 0]}


def test_a_known_mask_sizes_the_selection_of_unknown_values(a100, stack24):
    # PyG's gcn.py: `F.cross_entropy(out[data.train_mask], data.y[data.train_mask])`, the
    # model's output unknown, the labels and the mask moved from the host (known)
    seen = {}

    def job():
        mask = (torch.arange(120) < 40).cuda()
        labels = torch.zeros(120, dtype=torch.long).cuda()
        out = torch.randn(120, 1024, device="cuda", requires_grad=True)
        selected = out[mask]
        seen["shapes"] = (tuple(selected.shape), tuple(labels[mask].shape))
        torch.nn.functional.cross_entropy(selected, labels[mask]).backward()

    result = run(job, a100, stack24)
    assert seen["shapes"] == ((40, 1024), (40,))
    # the selection is 40 rows of 1024 floats, not the bound of all 120
    sizes = [size for size, tag in allocations(result.trace) if tag.op.startswith("index")]
    assert 40 * 1024 * 4 in sizes and 120 * 1024 * 4 not in sizes, sizes
    assert not result.data_dependent


def test_a_broadcast_beyond_the_bound_is_not_computed_on_the_host(a100, stack24):
    seen = {}

    def job():
        rows = torch.arange(60_000).cuda()
        outer = rows[:, None] == rows[None, :]  # 3.6e9 elements: not computed on the host
        seen["shape"] = tuple(outer.shape)
        seen["value"] = bool(outer[0, 0])

    run(job, a100, stack24)
    assert seen == {"shape": (60_000, 60_000), "value": False}


def test_unique_of_argmax_indices_is_bounded_by_the_dimension(a100, stack24):
    # torchmetrics' multiclass validation: `len(torch.unique(preds)) <= num_classes` of
    # `preds = logits.argmax(dim=1)` (the model's logits: unknown values)
    seen = {}

    def job():
        logits = torch.randn(32, 10, device="cuda")
        preds = torch.argmax(logits, dim=1)
        seen["unique"] = len(torch.unique(preds))
        seen["method"] = len(preds.unique(sorted=True, return_counts=True)[1])
        seen["flat"] = len(torch.unique(logits.argmax()))  # no dim: no bound below numel
        seen["inverse"] = torch.unique(preds, return_inverse=True)[1].shape  # like the input

    run(job, a100, stack24)
    assert seen == {"unique": 10, "method": 10, "flat": 1, "inverse": torch.Size([32])}


def test_isfinite_of_unknown_values_reads_true(a100, stack24):
    # Lightning's EarlyStopping(check_finite=True) stops when `torch.isfinite(current)` is False:
    # the 0-d placeholder (False) stopped every fake run after its first validation
    seen = {}

    def job():
        metric = torch.randn(8, device="cuda").mean()  # unknown
        seen["finite"] = bool(torch.isfinite(metric))
        seen["all"] = bool(torch.isfinite(torch.randn(3, device="cuda")).all())
        seen["nan"] = bool(torch.isnan(metric))  # a condition: the 0-d placeholder, False

    run(job, a100, stack24)
    assert seen == {"finite": True, "all": True, "nan": False}


def test_membership_reads_known_values_and_placeholders_without_leaving_fake_mode(a100, stack24):
    """`value in t` is Python code (`(value == t).any().item()`) that runs below the capture's
    mode: read on the host as a whole, as transformers' `pad_token_id in input_ids[:, [-1, 0]]`
    (generate drops an all-ones attention mask, then GPT-2 checks for padding)."""
    seen = {}

    def job():
        ids = torch.tensor([[5, 7, 9], [0, 7, 9]], device="cuda")
        seen["known"] = (0 in ids[:, [-1, 0]], 9 in ids[:, [-1, 0]], 8 in ids)
        unknown = torch.randint(1, 5, (4,), device="cuda")  # no host values: zeros are read
        seen["placeholder"] = (0 in unknown, 3 in unknown)

    result = run(job, a100, stack24)
    assert seen == {"known": (True, True, False), "placeholder": (True, False)}
    assert result.mode == "fake"


def test_membership_reads_real_values_in_eager_mode(a100, stack24):
    seen = {}

    def job():
        seen["eager"] = 3 in torch.tensor([1, 2, 3], device="cuda") * 1

    run(job, a100, stack24, mode="eager")
    assert seen == {"eager": True}
