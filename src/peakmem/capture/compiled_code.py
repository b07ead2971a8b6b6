"""Compiled code under the capture: what ran "compiled" (the note), and Dynamo left untouched.

The capture runs compiled code eagerly: `torch.compile` is replaced for the job's run
(fake_cuda's `compile_as_eager`). Two ways around that replacement are handled here:

- Code compiled before the capture started (a module compiled at import in a process that
  imported it first: pytest, `peakmem warm`, the bench's in-process workers; gpt-fast's and
  attention-gym's `flex_attention = torch.compile(flex_attention)`). Its wrapper is Dynamo's
  `compile_wrapper`, which would trace the fake device tensors and hand them to Inductor ("PyTorch
  is not linked with support for cuda devices"). During the capture Dynamo's stance callback
  (`eval_frame._callback_from_stance`, called by every compiled wrapper on entry) answers "run
  eagerly", as `torch.compiler.set_stance("force_eager")` does, and the call is noted and bracketed
  by the "compiled region" marks like a call compiled during the capture. `torch.compiler.disable`
  regions (callback None or False) pass as they are.
- Dynamo's own state. Nearly every training job imports `torch._dynamo` for the first time
  during its capture (backward and `optimizer.step()` import it). Dynamo builds tables of torch's
  functions and types at import (`SourcelessBuilder._type_handlers` keyed by `torch.device`, which
  the capture replaces by a stand-in: capture/fake_device_ordinal.py): built then, they hold the
  capture's stand-ins for the rest of the process, and every later `torch.compile` outside a
  capture fails ("SourcelessBuilder.create does not know how to wrap torch.device", or "Handler
  already registered for FakeStreams.current_stream"). `torch._dynamo` is imported before the
  capture patches anything, and Dynamo's compiled-code caches are reset after it. A job's
  tweaks of `torch._dynamo.config` / `torch._inductor.config` / `torch._functorch.config` are put
  back after it; `torch._dynamo.reset()` and `torch.compiler.cudagraph_mark_step_begin()` work
  inside it (Inductor's CUDA graph trees cannot be imported by a CPU-only torch; none is
  recorded).

Compiled functions the capture treats specially: `FUSED_COMPILES` (Inductor keeps none of their
temporaries: `create_block_mask`) and `STAND_INS` (what Dynamo does to their arguments is done
here: flex_attention's closed-over tensors lifted into the operator's buffers).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from peakmem.capture.session import CaptureSession
from peakmem.trace.vocab import Mark

LIBRARY_KERNEL_COMPILES = ("bitsandbytes.",)
"""Modules whose `torch.compile` calls compile the library's own fallback kernels for the host
(bitsandbytes' default backend) at import: not the job's compiled code, not noted."""

MODELLED_KERNEL_COMPILES = ("torch.nn.attention.flex_attention",)
"""Modules whose compiled functions the capture replaces by the compiled kernel's allocations
(capture/flex_attention.py): flex_attention's own internal `torch.compile` of its operator and a
job's `torch.compile(flex_attention)` run nothing eagerly that Inductor would fuse: not noted."""

FUSED_COMPILES: dict[str, str] = {
    "torch.nn.attention.flex_attention.create_block_mask": (
        "create_block_mask compiled (torch.compile or _compile=True): its dense "
        "B x H x Q_LEN x KV_LEN mask and the other temporaries were left out, as Inductor fuses "
        "the mask_mod into the block counts; the BlockMask's tensors are kept"
    ),
}
"""Compiled functions whose temporaries Inductor fuses away entirely (module.qualname -> the
note): run eagerly, every allocation made and freed again during the call is dropped
(fused_updates.drop_freed_since); what the call returns stays."""


def _lifted_flex_attention(target: Any) -> Any:
    from peakmem.capture.flex_attention import lifted_hop_wrapper

    return lifted_hop_wrapper(target)


STAND_INS: dict[str, Callable[[Any], Any]] = {
    "torch.nn.attention.flex_attention.flex_attention.<locals>._flex_attention_hop_wrapper":
        _lifted_flex_attention,
}
"""Compiled functions the capture modelled itself that need what Dynamo does to their
arguments (module.qualname -> the stand-in for the compiled function, given the function)."""

EAGER_NOTE_START = "torch.compile was not applied"
CUDA_GRAPH_POOLS = (
    ": Inductor's CUDA graph trees (torch/_inductor/cudagraph_trees.py) take the graphs' "
    "activations, outputs and static copies of their non-parameter inputs from one pool that "
    "stays reserved between replays and that memory outside the graphs cannot reuse, so the "
    "compiled run may reserve more than this estimate"
)
GRAPH_MODES = ("reduce-overhead", "max-autotune")
"""torch.compile modes that record CUDA graphs (Inductor's `triton.cudagraphs`; not
"max-autotune-no-cudagraphs")."""
GRAPH_OPTION = "triton.cudagraphs"


def graph_mode(mode: str | None, options: dict | None) -> str | None:
    """The mode torch.compile was given, or "reduce-overhead" where its Inductor options turn
    CUDA graphs on (`options={"triton.cudagraphs": True}`: what that mode sets)."""
    if mode is None and isinstance(options, dict) and options.get(GRAPH_OPTION):
        return "reduce-overhead"
    return mode


def compiled_name(target: Any) -> str:
    """How the note names a compiled module or function (a bound `Module.__call__` or
    `_call_impl`, as `Module.compile()` and `OptimizedModule` compile: its module's class)."""
    if isinstance(target, torch.nn.Module):
        return type(target).__name__
    owner = getattr(target, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        return type(owner).__name__
    return getattr(target, "__qualname__", None) or type(target).__name__


def region_start(name: str, mode: str | None) -> CaptureSession | None:
    """Compiled `name` is called: noted, marked and timed in the capture running now (None
    outside any)."""
    from peakmem.capture import compiled_timing

    live = current_session()
    if live is not None:
        runs = compiled_runs(live)
        runs.declare(name, mode)
        runs.run(name)
        live.mark(Mark.COMPILED.value)
        compiled_timing.CLOCK.enter()
    return live


def region_end(live: CaptureSession | None) -> None:
    """The call `region_start` began (in `live`) returned or raised."""
    from peakmem.capture import compiled_timing

    if live is not None:
        if not live.closed:
            live.mark(Mark.COMPILED_END.value)
        compiled_timing.CLOCK.leave()


class EagerRegion:
    """The `dynamo_ctx` of a compiled view (`compiled_view`): where Dynamo's context wraps the
    module's `__call__` in compiled code, this wraps it in a "compiled region" (noted, marked and
    timed as compiled) that runs eagerly. Plain data, so a view deep-copies and pickles as an
    OptimizedModule does (its `__reduce__` passes the context on)."""

    def __init__(self, name: str, mode: str | None) -> None:
        self.name = name
        self.mode = mode

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        import functools

        @functools.wraps(fn)
        def compiled(*args: Any, **kwargs: Any) -> Any:
            live = region_start(self.name, self.mode)
            try:
                return fn(*args, **kwargs)
            finally:
                region_end(live)

        return compiled


_VIEW_CLASS: list[type] = []


def view_class() -> type:
    """The compiled view's class: torch's own `OptimizedModule` (torch/_dynamo/eval_frame.py)
    with two methods replaced. `__call__` leaves out the warning OptimizedModule gives when any
    global module hook is registered (the capture's own are, for every job: torch would not
    warn on the GPU) and keeps its "in an optimized module" flag. `_initialize` makes `forward`
    the context around `_orig_mod.__call__` (what torch does for most modules; for a torch.nn
    module it calls `external_utils.wrap_inline(_orig_mod)`, the same call here) without
    consulting Dynamo's trace rules, and keeps the lazy-module check."""
    if not _VIEW_CLASS:
        import contextlib

        from torch._dynamo import eval_frame

        in_optimized_module = getattr(eval_frame, "_set_in_optimized_module",
                                      contextlib.nullcontext)  # torch < 2.6 has none

        class OptimizedModule(eval_frame.OptimizedModule):
            __doc__ = eval_frame.OptimizedModule.__doc__

            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                # the whole call is timed as compiled code (its hooks too: the capture's own
                # module hooks on the view are host time a GPU run does not have), the marks
                # stay around `_orig_mod`'s call (EagerRegion)
                from peakmem.capture import compiled_timing

                timed = current_session() is not None
                if timed:
                    compiled_timing.CLOCK.enter()
                try:
                    with in_optimized_module():
                        return torch.nn.Module.__call__(self, *args, **kwargs)
                finally:
                    if timed:
                        compiled_timing.CLOCK.leave()

            def _initialize(self) -> None:
                self.forward = self.dynamo_ctx(self._orig_mod.__call__)
                if hasattr(self._orig_mod, "_initialize_hook"):
                    self._forward = self.forward
                    self.forward = self._call_lazy_check

        OptimizedModule.__module__ = __name__
        OptimizedModule.__qualname__ = "OptimizedModule"
        _VIEW_CLASS.append(OptimizedModule)
    return _VIEW_CLASS[0]


def __getattr__(name: str) -> Any:
    """`OptimizedModule` (the view's class, made on first use: importing torch._dynamo is
    slow) for pickle, which finds a class by its module and name."""
    if name == "OptimizedModule":
        return view_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def compiled_view(module: torch.nn.Module, name: str | None = None,
                  mode: str | None = None) -> torch.nn.Module:
    """What `torch.compile(module)` returns under the capture: an instance of torch's
    OptimizedModule (`view_class`, so `isinstance(model, OptimizedModule)` holds) around the
    module, built as torch builds one, whose forward runs the module's `__call__` eagerly in a
    "compiled region" (`EagerRegion`, named `name`, default the module's class name; `mode` is
    torch.compile's). As with torch: `_orig_mod` is a submodule (state_dict keys get the
    `_orig_mod.` prefix, and `load_state_dict` through the view wants it), every other attribute
    is read from and written to the module (`model.config`, `model.generate`, what a forward
    writes), `training` is the module's (`.train()` / `.eval()` on either is seen by both), the
    view has call hooks of its own (FSDP2's `fully_shard` puts its hooks and class on the view,
    as torchtitan's per-block compile does) and the module's hooks run inside its own call. The
    module called directly (the torch.compile tutorial times `model(x)` against
    `torch.compile(model)(x)`) stays an eager call, as with torch."""
    view = view_class()(module, EagerRegion(name or compiled_name(module), mode))
    # what torch._dynamo's context sets on the OptimizedModule it makes
    view._torchdynamo_orig_callable = module.forward
    view._torchdynamo_wrapper_id = id(view)
    view.get_compiler_config = _no_compiler_config
    return view


def _no_compiler_config() -> None:
    """`OptimizedModule.get_compiler_config()`: no backend compiles here."""
    return None


def is_modelled_or_library(target: Any) -> bool:
    """Compiled code the capture models itself (flex_attention) or a library's host kernels:
    never noted as having run eagerly."""
    module = str(getattr(target, "__module__", ""))
    return module.startswith(LIBRARY_KERNEL_COMPILES + MODELLED_KERNEL_COMPILES)


def _key(target: Any) -> str:
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', '')}"


def stand_in(target: Any) -> Any:
    """What runs for compiled `target`: its stand-in (STAND_INS) or itself."""
    make = STAND_INS.get(_key(target))
    return target if make is None else make(target)


def fused_note(target: Any) -> str | None:
    """The note for a compiled function whose temporaries Inductor fuses away (else None)."""
    return FUSED_COMPILES.get(_key(target))


def fused_call_start(session: CaptureSession) -> int:
    return len(session.trace)


def fused_call_end(session: CaptureSession, start: int, note: str) -> None:
    """The fused function returned: drop the temporaries it made since `start`; note it."""
    from peakmem.capture import fused_updates

    if fused_updates.drop_freed_since(session, start) and note not in session.notes:
        session.notes.append(note)


def fused_stand_in(target: Any, note: str) -> Any:
    """`target` as torch.compile makes it, run eagerly without its fused temporaries (in the
    capture running when it is called)."""
    import functools

    @functools.wraps(target)
    def compiled(*args: Any, **kwargs: Any) -> Any:
        session = current_session()
        if session is None:
            return target(*args, **kwargs)
        start = fused_call_start(session)
        returned = target(*args, **kwargs)
        fused_call_end(session, start, note)
        return returned

    return compiled


class CompiledRuns:
    """The compiled modules and functions a capture saw declared and run, and the note."""

    def __init__(self, session: CaptureSession) -> None:
        self.session = session
        self.names: list[str] = []
        self.modes: dict[str, str | None] = {}
        self.ran: set[str] = set()

    def declare(self, name: str, mode: str | None) -> None:
        if name not in self.names:
            self.names.append(name)
            self.modes[name] = mode

    def run(self, name: str) -> None:
        """`name` ran (eagerly): the note names every compiled thing that ran so far."""
        if name in self.ran:
            return
        self.ran.add(name)
        names = [compiled for compiled in self.names if compiled in self.ran]
        listed = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        note = (
            f"{EAGER_NOTE_START}: {listed} ran eagerly; Inductor fuses chains of "
            "elementwise ops and frees (or recomputes in backward) their intermediates, so "
            "the activations traced are an upper bound for the compiled run"
        )
        graph_modes = dict.fromkeys(
            self.modes[compiled] for compiled in names if self.modes[compiled] in GRAPH_MODES
        )
        for graph_mode in graph_modes:
            note += (
                f"; mode={graph_mode!r} also records CUDA graphs, whose private memory "
                "pools are not modelled"
            )
        if graph_modes:
            note += CUDA_GRAPH_POOLS
        notes = self.session.notes
        notes[:] = [n for n in notes if not n.startswith(EAGER_NOTE_START)]
        notes.append(note)


_RUNS: dict[int, CompiledRuns] = {}
_SESSIONS: list[CaptureSession] = []
"""The captures running (innermost last)."""


def current_session() -> CaptureSession | None:
    """The capture running now (None outside any), still recording."""
    if _SESSIONS and not _SESSIONS[-1].closed:
        return _SESSIONS[-1]
    return None


def compiled_runs(session: CaptureSession) -> CompiledRuns:
    """The session's record of compiled code (one per session, dropped when it is closed)."""
    runs = _RUNS.get(id(session))
    if runs is None or runs.session is not session:
        runs = _RUNS[id(session)] = CompiledRuns(session)
    return runs


def _forget(session: CaptureSession) -> None:
    runs = _RUNS.get(id(session))
    if runs is not None and runs.session is session:
        del _RUNS[id(session)]


def dynamo_caches_reset() -> None:
    """Drop what Dynamo compiled and cached (code caches, guards on tensors the capture made)."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


_RAISED = object()
"""What a compiled call that raised returned (not None: no fused update to drop)."""


def _graph_mode_of(eval_frame: Any, callback: Any) -> str | None:
    """The CUDA-graph mode a Dynamo callback compiles with (its Inductor backend's config:
    `triton.cudagraphs`, with `max_autotune` for "max-autotune"), else None."""
    innermost = getattr(eval_frame, "innermost_backend", None)
    try:
        backend = innermost(callback) if innermost is not None else None
    except Exception:  # noqa: BLE001 - a backend Dynamo cannot unwrap: no CUDA graphs known
        return None
    config = getattr(backend, "config", None)
    if not isinstance(config, dict) or not config.get(GRAPH_OPTION):
        return None
    return "max-autotune" if config.get("max_autotune") else "reduce-overhead"


COMPILER_CONFIGS = ("torch._dynamo.config", "torch._inductor.config", "torch._functorch.config")
"""Config modules a job may tweak (`torch._dynamo.config.cache_size_limit = 64`, ...): put
back after the capture, so one job's settings do not steer the next compile in the process."""


@contextmanager
def compiler_configs_restored() -> Iterator[None]:
    saved = []
    with warnings.catch_warnings():  # reading a deprecated setting warns
        warnings.simplefilter("ignore")
        for name in COMPILER_CONFIGS:
            config = sys.modules.get(name)
            if config is not None and hasattr(config, "get_config_copy"):
                saved.append((config, config.get_config_copy()))
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for config, values in saved:
                now = config.get_config_copy()  # one pass, not a Python getattr per setting
                for key, value in values.items():
                    if _still_equal(now, key, value):
                        continue  # the check below would find nothing to put back
                    try:
                        if getattr(config, key) != value:
                            setattr(config, key, value)
                    except Exception:  # noqa: BLE001 - a setting that cannot be compared or set
                        continue


def _still_equal(now: dict[str, Any], key: str, value: Any) -> bool:
    """Whether the config's setting `key`, as read now (`get_config_copy`: the values
    `getattr` returns, mutable ones copied), equals its saved `value`; False when unsure (a
    value whose comparison fails or is not a plain truth value): then `getattr` decides."""
    current = now.get(key, _MISSING)
    if current is _MISSING:
        return False
    try:
        equal = current == value
    except Exception:  # noqa: BLE001 - a setting that cannot be compared
        return False
    return equal is True


_MISSING = object()


@contextmanager
def precompiled_code_runs_eagerly(session: CaptureSession) -> Iterator[None]:
    """See the module's docstring: enter before any of the capture's patches."""
    import torch._dynamo  # its tables built from the real torch
    from torch._dynamo import eval_frame

    from peakmem.capture import fused_updates

    original_stance = eval_frame._callback_from_stance
    original_set = eval_frame._maybe_set_eval_frame
    open_calls: list[list[Any]] = []  # [wrapper frame, eval-frame sets so far, at its end]

    def callback_from_stance(callback: Any) -> Any:
        if callback in (False, None):  # torch.compiler.disable / run-only: as it is
            return original_stance(callback)
        caller = sys._getframe(1)  # the compiled wrapper (`compile_wrapper`), `fn` its target
        target = caller.f_locals.get("fn")
        note = fused_note(target)
        if note is not None:
            start = fused_call_start(session)
            open_calls.append([caller, 0, lambda: fused_call_end(session, start, note)])
        elif target is not None and not is_modelled_or_library(target):
            runs = compiled_runs(session)
            name = compiled_name(target)
            runs.declare(name, _graph_mode_of(eval_frame, callback))
            runs.run(name)
            session.mark(Mark.COMPILED.value)
            fullgraph = bool(getattr(caller.f_locals.get("self"), "fullgraph", False))
            fused = fused_updates.begin(session, fullgraph)

            def region_end() -> None:  # the wrapper's `result` (absent: it raised)
                fused_updates.end(session, fused, caller.f_locals.get("result", _RAISED))
                session.mark(Mark.COMPILED_END.value)

            open_calls.append([caller, 0, region_end])
        return None  # run eagerly: `torch.compiler.set_stance("force_eager")`'s answer

    def maybe_set_eval_frame(callback: Any) -> Any:
        """The wrapper sets the eval frame twice from its frame: entering, then leaving."""
        result = original_set(callback)
        if open_calls and sys._getframe(1) is open_calls[-1][0]:
            open_calls[-1][1] += 1
            if open_calls[-1][1] == 2:
                open_calls.pop()[2]()
        return result

    original_reset = torch._dynamo.reset

    def reset() -> None:
        """`torch._dynamo.reset()` / `torch.compiler.reset()`: with a CUDA device it resets
        Inductor's CUDA graph trees, whose module a CPU-only torch cannot import; the capture
        records no CUDA graph, so the reset runs as on a machine without one."""
        answer = torch.cuda.is_available
        torch.cuda.is_available = lambda: False
        try:
            original_reset()
        finally:
            torch.cuda.is_available = answer

    original_mark_step = torch.compiler.cudagraph_mark_step_begin

    def cudagraph_mark_step_begin() -> None:
        """gpt-fast's and torchtitan's per-step call with mode="reduce-overhead": it marks a
        step of Inductor's CUDA graph trees (a module a CPU-only torch cannot import); no CUDA
        graph is recorded here."""

    eval_frame._callback_from_stance = callback_from_stance
    eval_frame._maybe_set_eval_frame = maybe_set_eval_frame
    torch._dynamo.reset = reset
    torch.compiler.cudagraph_mark_step_begin = cudagraph_mark_step_begin
    try:
        # the stance too: a `fullgraph=True` wrapper that compiled nothing raises ("found no
        # compiled frames") unless the stance says eager
        _SESSIONS.append(session)
        with torch.compiler.set_stance("force_eager"), compiler_configs_restored():
            yield
    finally:
        _SESSIONS[:] = [running for running in _SESSIONS if running is not session]
        eval_frame._callback_from_stance = original_stance
        eval_frame._maybe_set_eval_frame = original_set
        torch._dynamo.reset = original_reset
        torch.compiler.cudagraph_mark_step_begin = original_mark_step
        dynamo_caches_reset()
        _forget(session)
