"""Run a callable or an unmodified script under capture, stopping after N optimizer steps."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

import torch

from peakmem.capture import job_alloc_conf, network_access, vision_image_ops, vision_ops
from peakmem.capture.capture_modes import capture_modes
from peakmem.capture.compiled_code import precompiled_code_runs_eagerly
from peakmem.capture.discarded_grads import watching_discarded_grads
from peakmem.capture.eager import EagerMemoryError, ShadowExecutor
from peakmem.capture.fake_cuda import fake_cuda_runtime
from peakmem.capture.interpreter_state import interpreter_state_restored
from peakmem.capture.library_patches import library_patches
from peakmem.capture.phases import PhaseTracker, StopJob
from peakmem.capture.recorder import AllocationRecorder
from peakmem.capture.repeated_forwards import RepeatedForwards
from peakmem.capture.repeated_forwards import enabled_by_env as repeating_forwards
from peakmem.capture.result import (
    DEFAULT_STEPS,
    NO_DEVICE_NOTE,
    CaptureResult,
    first_line,
    safe_str,
)
from peakmem.capture.session import CaptureSession
from peakmem.capture.side_effects import divert_fake_saves
from peakmem.capture.threads import join_job_threads, threads_note, traced_threads
from peakmem.capture.torch_function_off import TORCH_FUNCTION_OFF, is_unmapped_cuda
from peakmem.capture.unsupported import Unsupported
from peakmem.capture.value_steered import value_steered_optimizers
from peakmem.cuda_rules import (
    COMPOSITE_RULES,
    FUSED_KERNELS,
    RUNTIME_PATCHES,
    SPARSE_COMPRESSED_KERNELS,
    SPARSE_KERNELS,
)
from peakmem.inputs import JobInputError, describe
from peakmem.jobs.exit_handlers import ended_normally, job_exit_handlers
from peakmem.jobs.runner import (
    JobSpec,
    JobSpecError,
    JobTimeout,
    _is_runner_frame,
    execute,
    script_environment,
    script_exists,
    time_limit,
    user_traceback,
)
from peakmem.jobs.stop import Steps, parse_steps
from peakmem.profiles import GpuProfile, StackProfile
from peakmem.trace.events import ALLOC_KINDS
from peakmem.utilization.observer import OpCostObserver

_CLOCK = time.perf_counter
"""The capture's own clock, bound at import: the job may rebind `time.perf_counter` (a job's
own timer stub) before the capture reads it at the end."""


def _overload(name: str) -> Any:
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def _composite_kernel(session: CaptureSession, name: str, rule: Callable[..., Any]) -> Callable:
    op = _overload(name)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        return rule(session, op, *args, **kwargs)

    return kernel


@contextmanager
def _cuda_kernels(session: CaptureSession) -> Iterator[None]:
    """Install the fused kernels (Meta key) and composite rules (the meta autograd key) for the
    capture; they are removed afterwards."""
    library = torch.library.Library("aten", "IMPL")
    try:
        for name, kernel in FUSED_KERNELS.items():
            # bypasses Library.impl's check: these ops decompose on meta on purpose elsewhere
            library.m.impl(name, "Meta", kernel, False)
        for name, kernel in SPARSE_KERNELS.items():
            library.m.impl(name, "SparseMeta", kernel, False)
        for name, kernel in SPARSE_COMPRESSED_KERNELS.items():
            library.m.impl(name, "SparseCsrMeta", kernel, False)
        for name, rule in COMPOSITE_RULES.items():
            library.impl(name, _composite_kernel(session, name, rule), "AutogradMeta")
        yield
    finally:
        library._destroy()


MODES = ("fake", "eager")


_BACKEND_FLAGS = (
    (torch.backends.cudnn, ("enabled", "benchmark", "deterministic", "allow_tf32")),
    (torch.backends.cuda.matmul, ("allow_tf32", "allow_fp16_reduced_precision_reduction",
                                  "allow_bf16_reduced_precision_reduction")),
)


@contextmanager
def backend_flags_restored() -> Iterator[None]:
    """The job may set `torch.backends.cudnn.benchmark` and the like (they steer the CUDA
    rules); they are put back afterwards so one capture does not change the next."""
    saved = []
    for owner, names in _BACKEND_FLAGS:
        for name in names:
            try:
                saved.append((owner, name, getattr(owner, name)))
            except (AttributeError, RuntimeError):
                continue
    try:
        yield
    finally:
        for owner, name, value in saved:
            with suppress(AttributeError, RuntimeError):
                setattr(owner, name, value)


def _replaced_own_module(exc: BaseException) -> str | None:
    """The peakmem module an ImportError names where the job had put something else in its
    place in sys.modules (python's `(unknown location)`: a module without a file; `None in
    sys.modules`): peakmem's failure to run, not the job's error. (peakmem's modules are back
    in sys.modules by now: `interpreter_state_restored`.)"""
    name = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
    if not isinstance(name, str) or name.split(".")[0] != "peakmem":
        return None
    text = safe_str(exc)
    replaced = text.endswith("(unknown location)") or text.endswith("None in sys.modules")
    return name if replaced else None


def _is_fake_limit(exc: BaseException) -> bool:
    """An error raised because the device tensors are fake, not by the job itself (for errors
    the recorder did not see: raised above the aten ops)."""
    text = safe_str(exc).lower()
    return isinstance(exc, NotImplementedError) or ("meta" in text and "device" not in text)


def _job_location(exc: BaseException) -> str | None:
    """`file:line` of the job's innermost frame in `exc`'s traceback."""
    import traceback

    torch_dir = str(Path(torch.__file__).parent)
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not _is_runner_frame(frame.filename) and not frame.filename.startswith(torch_dir)
    ]
    if not frames:
        return None
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}"


def fake_limit_message(reason: str, exc: BaseException | None = None) -> str:
    where = _job_location(exc) if exc is not None else None
    at = f", called at {where}" if where else ""
    return (
        f"peakmem: fake mode cannot run this job: {reason}{at}; "
        "rerun with --mode eager (or --mode auto) to run it for real on the CPU"
    )


def _run_captured(
    job: Callable[[], Any],
    gpu: GpuProfile,
    stack: StackProfile,
    steps: Steps,
    timeout: float | None,
    mode: str = "fake",
) -> CaptureResult:
    if mode not in MODES:
        raise ValueError(f"unknown capture mode {mode!r}; choose one of {', '.join(MODES)}")
    if isinstance(steps, str):  # "all" (an int is taken as it is: 0 stops at the first step)
        steps = parse_steps(steps)
    session = CaptureSession(gpu=gpu, stack=stack)
    session.trace.meta.update(
        {"gpu": gpu.name, "stack": stack.name, "capture_torch": torch.__version__, "mode": mode}
    )
    executor = None
    if mode == "eager":
        executor = ShadowExecutor(session)
        session.eager, session.host_value = True, executor.host_value
    phases = PhaseTracker(session, stop_after_steps=steps)
    forwards = RepeatedForwards(session, phases) if repeating_forwards() else None
    op_costs = OpCostObserver(session)
    session.op_observer = op_costs.observe
    session.module_source = phases.current_module
    vision_ops.declare_torchvision_ops()  # a CPU-only torch cannot load torchvision's compiled ops
    vision_image_ops.declare_image_ops()  # nor its image extension (read_image / decode_image)
    result = CaptureResult(
        trace=session.trace, steps=0, stopped=False, forward_calls=0, seconds=0, mode=mode
    )
    start = _CLOCK()

    def in_progress() -> CaptureResult:
        snapshot = CaptureResult(
            trace=session.trace, steps=0, stopped=False, forward_calls=0, seconds=0, mode=mode
        )
        _collect(snapshot, session, phases, executor, start, forwards)
        return snapshot

    with ExitStack() as stack_ctx:
        stack_ctx.enter_context(backend_flags_restored())
        stack_ctx.enter_context(precompiled_code_runs_eagerly(session))  # before any patch
        stack_ctx.enter_context(fake_cuda_runtime(session))
        stack_ctx.enter_context(library_patches())
        stack_ctx.enter_context(traced_threads())
        for patch in RUNTIME_PATCHES.values():
            stack_ctx.enter_context(patch())
        stack_ctx.enter_context(_cuda_kernels(session))
        stack_ctx.enter_context(divert_fake_saves(session))
        stack_ctx.enter_context(value_steered_optimizers(session))
        stack_ctx.enter_context(watching_discarded_grads(session.state))
        stack_ctx.enter_context(phases)
        if forwards is not None:  # module calls: after the tracker's hooks are registered
            stack_ctx.enter_context(forwards.installed())
        _ACTIVE.append(in_progress)
        try:
            with ExitStack() as modes:
                modes.enter_context(time_limit(timeout))
                # the host deferral over the device map, as one torch-function mode
                function_mode = modes.enter_context(capture_modes(session, phases))
                if executor is not None:  # inside the recorder: it sees the meta outputs
                    modes.enter_context(executor)
                # the torch-function mode puts it back where the job turns it off
                function_mode.recorder = modes.enter_context(AllocationRecorder(session))
                modes.enter_context(interpreter_state_restored())  # exits first
                phases.run(job)
        except StopJob:
            pass
        except EagerMemoryError as exc:
            result.error, result.exit_code, result.reason = exc, 1, "host_memory"
            result.error_text = f"peakmem: {exc}"
        except SystemExit as exc:
            _record_system_exit(result, exc)
        except JobTimeout as exc:
            result.error, result.exit_code, result.error_text = exc, 124, str(exc)
            result.reason = "timeout"
        except BaseException as exc:  # the job's own error (KeyboardInterrupt and
            # BaseException subclasses included): reported with its traceback
            result.error, result.exit_code, result.reason = exc, 1, "raised"
            result.error_type = type(exc).__name__
            result.error_text = _safe_traceback(exc)
            if isinstance(exc, JobInputError):  # peakmem's check in the job: one line
                result.reason, result.error_text = "bad_input", safe_str(exc)
            elif session.fake_limit is None and not session.eager and _is_fake_limit(exc):
                session.fake_limit = f"{type(exc).__name__}: {first_line(exc)}"
            if session.fake_limit is not None and result.reason != "bad_input":
                result.error_text = fake_limit_message(session.fake_limit, exc)
                result.reason = "fake_limit"
            poisoned = _replaced_own_module(exc)
            if poisoned is not None:
                exc = Unsupported(f"jobs that replace peakmem's own module {poisoned} in "
                                  "sys.modules (the capture imports it while the job runs)")
                result.error, result.error_type = exc, "Unsupported"
            elif is_unmapped_cuda(exc):  # `x.cuda()` under torch._C.DisableTorchFunction()
                exc = Unsupported(TORCH_FUNCTION_OFF)
                result.error, result.error_type = exc, "Unsupported"
            if isinstance(exc, Unsupported):
                result.reason, result.error_text = "unsupported", safe_str(exc)
            elif getattr(exc, "peakmem_simulated_oom", False):
                result.reason = "simulated_oom"  # the capped simulated allocator ran out
        finally:
            session.close()
            op_costs.finish()
            _ACTIVE.pop()
    _collect(result, session, phases, executor, start, forwards)
    return result


_ACTIVE: list[Callable[[], CaptureResult]] = []


def capture_in_progress() -> CaptureResult | None:
    """What the innermost running capture has recorded so far (None outside a capture): for a
    job that ends its process itself (os._exit) in the middle of its run."""
    return _ACTIVE[-1]() if _ACTIVE else None


_EXIT_CODE_LIMIT = 1 << 63
"""sys.exit(n) with n outside a C long: python cannot convert it and exits with -1."""


def _record_system_exit(result: CaptureResult, exc: SystemExit) -> None:
    """sys.exit(0) / sys.exit(None) is a normal end; sys.exit(n) with any other int (256
    included: a shell would see 0, but the job asked for 256) and sys.exit("message") fail.
    The code may be a hostile object (an int subclass whose __eq__ or __str__ raises)."""
    code = exc.code
    if code is None or code is False:
        return
    if isinstance(code, int):
        number = int.__int__(code)  # the int itself, whatever the subclass overrides
        if number == 0:
            return
        result.error, result.reason = exc, "exit"
        if not -_EXIT_CODE_LIMIT <= number < _EXIT_CODE_LIMIT:  # python exits with -1 (255)
            result.exit_code = result.job_exit_code = -1
            result.error_text = f"the job exited with status -1: sys.exit({describe(number)})"
            return
        result.exit_code = result.job_exit_code = number
        result.error_text = f"the job exited with status {number} (sys.exit)"
        return
    try:  # python prints the object and exits with status 1
        text = str(code)
        text = text if isinstance(text, str) else f"<{type(code).__name__}>"
    except BaseException:  # noqa: BLE001 - a hostile __str__
        text = f"<{type(code).__name__}>"
    result.error, result.reason = exc, "exit"
    result.exit_code = result.job_exit_code = 1
    result.error_text = f"the job exited with status 1: {text}"


def _safe_traceback(exc: BaseException) -> str:
    """The job's trimmed traceback; a last-resort line if formatting it fails."""
    try:
        return user_traceback(exc)
    except BaseException:  # noqa: BLE001 - a hostile exception object
        return f"{type(exc).__name__}: <the traceback could not be formatted>"


def _collect(
    result: CaptureResult,
    session: CaptureSession,
    phases: PhaseTracker,
    executor: ShadowExecutor | None,
    start: float,
    forwards: RepeatedForwards | None = None,
) -> None:
    """Fill `result` from the session once the job has ended."""
    result.seconds = _CLOCK() - start
    hint = phases.failure_hint()
    if (hint is not None and result.error_text and session.fake_limit is None
            and result.reason != "bad_input"):
        result.error_text = result.error_text.rstrip() + "\n" + hint
    result.steps = session.state.steps
    result.stopped = session.state.stopped
    result.forward_calls = session.state.forward_calls
    result.notes.extend(session.notes)
    result.failure_hint = "; ".join(
        network_access.relevant_hints(session.failure_hints, result.error)) or None
    result.failed_after_shortening = phases.failed_after_shortening
    if vision_ops.declared() and "torchvision" in sys.modules:
        result.notes.append(vision_ops.NOTE)
    if vision_image_ops.used():
        result.notes.append(vision_image_ops.NOTE)
    result.libraries = dict(session.libraries)
    result.fake_limit = session.fake_limit
    result.host_reads = session.host_reads
    result.host_reads_before_forward = session.host_reads_before_forward
    result.data_dependent = dict(session.data_dependent)
    result.peak_device_bytes = session.max_allocated_bytes
    if executor is not None:
        result.notes.extend(_eager_notes(executor))
    if result.error is None:
        result.notes.extend(phases.notes())
        result.notes.extend(_device_use_notes(session))
    replayed = forwards.note() if forwards is not None else None
    if replayed is not None:
        result.notes.append(replayed)
    result.backward_passes = session.state.backward_passes
    session.trace.meta.update(phases.trace_meta())
    if session.devices is not None:  # DataParallel over several GPUs: the others' estimates
        from peakmem.capture.data_parallel import device_reports

        traces = session.devices.device_traces()
        result.device_traces = {index: trace for index, (trace, _) in traces.items()}
        try:
            result.devices = device_reports(session, result, traces)
        except Exception as exc:  # noqa: BLE001 - e.g. allocator settings refused: device 0 stands
            result.notes.append(f"the other GPUs' estimates failed ({type(exc).__name__}: "
                                f"{str(exc)[:200]}): the estimate is cuda:0's")


def _device_use_notes(session: CaptureSession) -> list[str]:
    if any(kind in ALLOC_KINDS for kind in session.trace.kinds) or session.libraries:
        return []
    return [NO_DEVICE_NOTE]


def _eager_notes(executor: ShadowExecutor) -> list[str]:
    notes = [
        f"eager: real values held {executor.max_shadow_bytes / 2**30:.2f} GiB of host RAM at most"
    ]
    if executor.meta_only_ops:
        notes.append(
            "eager: no CPU kernel for " + ", ".join(sorted(executor.meta_only_ops))
            + ": their outputs hold zeros (sizes are exact, later values may not be)"
        )
    if executor.no_shadow:
        notes.append(
            f"eager: {executor.no_shadow} device tensor(s) made outside the capture's sight "
            "held zeros"
        )
    return notes


def capture_callable(
    fn: Callable[..., Any],
    *args: Any,
    gpu: GpuProfile,
    stack: StackProfile,
    steps: Steps = DEFAULT_STEPS,
    timeout: float | None = None,
    mode: str = "fake",
    **kwargs: Any,
) -> CaptureResult:
    """Run `fn(*args, **kwargs)` with "cuda" shaped like `gpu`; stop after `steps` optimizer
    steps ("all": run to the end; None: at least 3, or a short DataLoader epoch plus 2, then
    the training loop is ended early so what follows it runs: capture.phases). `mode`: "fake" (device tensors
    are meta tensors) or "eager" (the same, plus their real values computed on the CPU)."""
    return _run_captured(lambda: fn(*args, **kwargs), gpu, stack, steps, timeout, mode)


def capture_command(
    argv: list[str],
    *,
    gpu: GpuProfile,
    stack: StackProfile,
    steps: Steps = DEFAULT_STEPS,
    timeout: float | None = None,
    mode: str = "fake",
    allow_code: bool = False,
) -> CaptureResult:
    """Run `python script.py args` / `python -m module args` (`python -c CODE args` where
    `allow_code`) in this process, unchanged."""
    spec = JobSpec.parse(argv, allow_code)
    if spec.script is not None and not script_exists(spec.script):
        raise JobSpecError(f"script not found: {spec.script}")

    still_running: list[str] = []
    conf_set: list[tuple[str, str]] = []

    def job() -> None:
        before = set(threading.enumerate())
        with script_environment(spec), job_exit_handlers() as exit_handlers:
            conf_start = job_alloc_conf.snapshot()
            try:
                try:
                    execute(spec)
                finally:
                    if changed := job_alloc_conf.changed_variable(conf_start):
                        conf_set.append(changed)
            except SystemExit as exc:
                if ended_normally(exc):  # `sys.exit(0)`: its threads are waited for, its
                    still_running.extend(join_job_threads(before))  # atexit handlers run
                    exit_handlers.run()
                raise
            still_running.extend(join_job_threads(before))  # as python's shutdown does
            exit_handlers.run()

    result = _run_captured(job, gpu, stack, steps, timeout, mode)
    if still_running:
        result.notes.append(threads_note(still_running))
    if conf_set and job_alloc_conf.META_KEY not in result.trace.meta:
        # set, but not before torch read it (the job's first CUDA use): where it was in time,
        # the estimate simulates it and says so (capture.job_alloc_conf, estimate/api.py)
        result.notes.append(job_alloc_conf.late_setting_note(*conf_set[0]))
    return result
