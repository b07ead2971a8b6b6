"""`torch.compile(module)` under the capture (compiled_code.compiled_view) against torch's own
OptimizedModule: the same scenario of idioms unmodified scripts use after `model =
torch.compile(model)` runs once with the real torch.compile (backend="eager", Dynamo tracing on
the CPU: the oracle) and once in a capture, where torch.compile is the capture's, and every
observation must be equal: isinstance / `_orig_mod` unwrapping, train / eval on either side,
state_dict keys (`_orig_mod.` prefix) and load_state_dict through the view, attributes read,
written and deleted through the view or by the forward, methods called through it (HF's
`model.generate`, `model.config`), hooks on the module and on the view, deepcopy, len, dir,
repr, `.to()`."""

import copy

import torch
from torch._dynamo.eval_frame import OptimizedModule

from peakmem.capture import capture_callable, compiled_code
from peakmem.trace.events import EventKind
from peakmem.trace.vocab import Mark


class Net(torch.nn.Module):
    kind = "class attribute"

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4))
        self.config = {"hidden": 4}
        self.calls = 0

    def forward(self, x):
        self.calls += 1  # what a forward writes lands on the module
        self.last_training = self.training
        return self.linear(x) * self.scale

    def generate(self, x):  # a method called through the compiled model: the module is `self`
        return type(self).__name__, self.calls


def _error(action) -> tuple[str, str] | None:
    try:
        action()
    except Exception as error:  # noqa: BLE001 - the observation is the error
        return type(error).__name__, str(error).splitlines()[0]
    return None


def scenario(compile_module, device: str) -> dict:
    """What an unmodified script sees of `compile_module(model)`."""
    seen: dict = {}
    events: list[str] = []
    model = Net().to(device)
    model.register_forward_hook(lambda *args: events.append("module hook"))
    compiled = compile_module(model)
    compiled.register_forward_hook(lambda *args: events.append("compiled hook"))
    x = torch.ones(2, 4, device=device)

    seen["isinstance"] = (isinstance(compiled, OptimizedModule),
                          isinstance(compiled, Net), isinstance(compiled, torch.nn.Module))
    seen["class"] = type(compiled).__name__
    raw = compiled._orig_mod if hasattr(compiled, "_orig_mod") else compiled
    seen["unwrapped"] = raw is model
    seen["keys"] = list(compiled.state_dict())
    seen["raw_keys"] = list(compiled._orig_mod.state_dict())
    seen["parameters"] = [name for name, _ in compiled.named_parameters()]
    seen["modules"] = [name for name, _ in compiled.named_modules()]
    seen["shared"] = compiled.linear is model.linear and compiled.config is model.config

    compiled(x)
    compiled(x)
    seen["calls"] = (model.calls, compiled.calls, "calls" in compiled.__dict__)
    seen["hooks"] = list(events)
    model(x)  # the module itself: its own hook only
    seen["hooks_direct"] = list(events)
    seen["generate"] = compiled.generate(x)

    compiled.eval()
    seen["eval"] = (model.training, compiled.training, model.linear.training)
    compiled(x)
    seen["forward_saw"] = model.last_training
    model.train()
    seen["train_from_module"] = compiled.training
    compiled.training = False
    seen["training_set"] = (model.training, model.linear.training)

    compiled.lr = 0.1
    compiled.kind = "set through the view"
    seen["set"] = (model.lr, model.kind, Net.kind, "lr" in compiled.__dict__)
    del compiled.lr
    seen["deleted"] = hasattr(model, "lr")
    seen["missing"] = _error(lambda: compiled.nope)

    zeros = {key: torch.zeros_like(value) for key, value in model.state_dict().items()}
    seen["load_plain"] = _error(lambda: compiled.load_state_dict(zeros))
    seen["load_prefixed"] = str(compiled.load_state_dict(
        {f"_orig_mod.{key}": value for key, value in zeros.items()}))
    seen["load_raw"] = str(compiled._orig_mod.load_state_dict(zeros))

    twin = copy.deepcopy(compiled)
    seen["deepcopy"] = (type(twin).__name__, twin._orig_mod is not model,
                        twin.linear is not model.linear, tuple(twin(x).shape))
    stack = compile_module(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    seen["len"] = (len(stack), _error(lambda: stack[0]))  # len is proxied, indexing is not
    seen["len_module"] = _error(lambda: len(compiled))
    seen["dir"] = {"generate", "config", "linear", "_orig_mod"} <= set(dir(compiled))
    seen["repr"] = repr(compiled)
    compiled.to(torch.float64)
    seen["to"] = (model.linear.weight.dtype, model.scale.dtype)
    return seen


def test_the_view_behaves_as_torchs_optimized_module(a100, stack24):
    torch._dynamo.reset()
    try:
        oracle = scenario(lambda module: torch.compile(module, backend="eager"), "cpu")
    finally:
        torch._dynamo.reset()
    seen = {}

    def job():
        seen.update(scenario(lambda module: torch.compile(module, backend="eager"), "cuda"))

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen == oracle
    # the facts the comparison rests on, as torch 2.13 has them
    assert oracle["isinstance"] == (True, False, True)
    assert oracle["keys"] == ["_orig_mod.scale", "_orig_mod.linear.weight",
                              "_orig_mod.linear.bias"]
    assert oracle["calls"] == (2, 2, False)
    assert oracle["hooks"] == ["module hook", "compiled hook"] * 2
    assert oracle["eval"] == (False, False, False) and oracle["forward_saw"] is False
    assert oracle["load_plain"][0] == "RuntimeError"


def test_view_calls_are_compiled_regions_and_the_module_called_directly_is_not(a100, stack24):
    def job():
        model = Net().cuda()
        compiled = torch.compile(model)
        x = torch.ones(2, 4, device="cuda")
        compiled(x)
        model(x)  # eager: no region
        compiled.generate(x)  # a method, not the compiled forward: no region
        compiled(x)

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    trace = result.trace
    labels = [trace.tag_of(i).op for i, kind in enumerate(trace.kinds) if kind == EventKind.MARK]
    assert labels.count(Mark.COMPILED.value) == labels.count(Mark.COMPILED_END.value) == 2
    # the model's modules are named as the model's own, without the wrapper's `_orig_mod`
    modules = {tag.module for tag in trace.tags} - {None}
    assert modules == {"Net", "Net.linear"}, modules
    assert [note for note in result.notes if note.startswith(compiled_code.EAGER_NOTE_START)
            ][0].startswith("torch.compile was not applied: Net ran eagerly")


def test_view_outside_a_capture_runs_the_module_and_pickles():
    import pickle

    model = Net()
    view = compiled_code.compiled_view(model, "Net", "reduce-overhead")
    assert view(torch.ones(1, 4)).shape == (1, 4) and model.calls == 1
    again = pickle.loads(pickle.dumps(view))
    assert type(again) is type(view) and isinstance(again, OptimizedModule)
    assert (again.dynamo_ctx.name, again.dynamo_ctx.mode) == ("Net", "reduce-overhead")
    assert again(torch.ones(1, 4)).shape == (1, 4) and again._orig_mod.calls == 2
