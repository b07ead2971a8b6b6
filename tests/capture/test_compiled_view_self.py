"""The compiled view (`compiled_code.compiled_view`, torch.compile(module)'s stand-in under the
capture) behaves as the OptimizedModule real torch.compile returns: each scenario runs once
with real `torch.compile(backend="eager")` on the CPU and once under the capture, and what the
job can observe must be the same. Before, the view's forward ran with the view as `self`: what
a forward wrote, and `.train()` / `.eval()` called on one of the two, were not seen by the
other."""

from __future__ import annotations

import copy

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.trace.events import EventKind
from peakmem.trace.vocab import Mark


class Counting(torch.nn.Module):
    """Its forward writes plain attributes and records who `self` is and its mode."""

    scale = 1  # a class attribute: set through the compiled module, it is the module's

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.dropout = torch.nn.Dropout(0.5)

    def forward(self, x):
        self.__dict__["seen_self"] = self  # not a submodule: a plain reference
        self.calls = getattr(self, "calls", 0) + 1
        self.mode_in_forward = self.training
        return self.dropout(self.linear(x))


def _observe(device: str) -> dict[str, object]:
    model = Counting().to(device)
    hooks = {"before": 0, "after": 0, "view": 0}
    model.register_forward_hook(lambda *a: hooks.__setitem__("before", hooks["before"] + 1))
    compiled = torch.compile(model, backend="eager")
    model.register_forward_hook(lambda *a: hooks.__setitem__("after", hooks["after"] + 1))
    compiled.register_forward_hook(lambda *a: hooks.__setitem__("view", hooks["view"] + 1))
    x = torch.randn(2, 4, device=device)
    seen: dict[str, object] = {}
    compiled(x)
    seen["self is the module"] = model.seen_self is model
    seen["calls"] = (model.calls, compiled.calls, "calls" in compiled.__dict__)
    model.eval()
    seen["module.eval(): view training"] = (compiled.training, compiled.linear.training)
    compiled(x)
    seen["forward's mode after module.eval()"] = model.mode_in_forward
    compiled.train()
    seen["view.train(): module training"] = (model.training, model.dropout.training)
    compiled.eval()
    seen["view.eval(): module training"] = (model.training, compiled.training)
    compiled(x)
    seen["forward's mode after view.eval()"] = model.mode_in_forward
    compiled.flag = 3
    compiled.scale = 2
    model.late = 5
    seen["attributes"] = (getattr(model, "flag", None), model.scale, compiled.late)
    model(x)  # the module itself: its hooks only
    seen["hooks"] = dict(hooks)
    seen["calls at the end"] = model.calls
    twin = copy.deepcopy(compiled)
    seen["deepcopy"] = (twin._orig_mod is not model, twin.training, twin.calls)
    return seen


def _marks(trace) -> list[str]:
    return [trace.tag_of(i).op for i, (kind, *_rest) in enumerate(trace.events())
            if kind == EventKind.MARK and trace.tag_of(i).op.startswith("compiled region")]


@pytest.fixture(scope="module")
def real() -> dict[str, object]:
    import torch._dynamo

    try:
        return _observe("cpu")
    finally:
        torch._dynamo.reset()


def test_the_view_behaves_as_real_torch_compiles_optimized_module(real, a100, stack24):
    seen: dict[str, object] = {}

    def job():
        seen.update(_observe("cuda"))

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen == real
    # what real torch does, spelled out (a mismatch above says which changed)
    assert real["self is the module"] is True
    assert real["calls"] == (1, 1, False)
    assert real["module.eval(): view training"] == (False, False)
    assert real["view.eval(): module training"] == (False, False)
    assert real["forward's mode after view.eval()"] is False
    assert real["attributes"] == (3, 2, 5)
    assert real["hooks"] == {"before": 4, "after": 4, "view": 3}
    # three compiled calls, each one bracketed once; the direct call is not
    assert _marks(result.trace) == [Mark.COMPILED.value, Mark.COMPILED_END.value] * 3
    notes = [n for n in result.notes if n.startswith("torch.compile was not applied")]
    assert len(notes) == 1 and ": Counting ran eagerly" in notes[0]


def test_a_raising_forward_still_closes_the_compiled_region(a100, stack24):
    class Raising(torch.nn.Module):
        def forward(self, x):
            raise ValueError("no")

    caught = {}

    def job():
        compiled = torch.compile(Raising())
        try:
            compiled(torch.zeros(1, device="cuda"))
        except ValueError:
            caught["raised"] = True

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert caught == {"raised": True}
    assert _marks(result.trace) == [Mark.COMPILED.value, Mark.COMPILED_END.value]


def test_the_view_is_still_an_instance_of_the_module_class_with_its_state_dict_keys():
    from peakmem.capture.compiled_code import compiled_view

    model = Counting()
    view = compiled_view(model)
    assert isinstance(view, Counting) and type(view).__name__ == "Counting"
    assert list(view.state_dict()) == list(model.state_dict())
    assert view.linear is model.linear and view._orig_mod is model
    view.half()
    assert model.linear.weight.dtype == torch.half
    twice = compiled_view(view)  # torch.compile of a compiled module wraps it again
    assert twice._orig_mod is view and twice.linear is model.linear
    twice.eval()
    assert not model.training and not view.training
