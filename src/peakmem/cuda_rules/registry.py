"""Where a CUDA kernel allocates differently from the CPU/meta kernel the capture runs, a rule
says what CUDA does. Rules come in four kinds, each in its own registry (a duplicate registration
is an error):

- op rules: add what the CUDA kernel of an aten op allocates besides its outputs (library
  workspaces, per-call scratch). A plain rule runs after the op's outputs were recorded; a
  generator rule runs up to its `yield` before the outputs are recorded and after it with the
  outputs, so scratch can be live around the output allocation as in the CUDA kernel;
- composite rules: kernels for aten ops that decompose above the backend (CompositeImplicit,
  e.g. `dropout`, `scaled_dot_product_attention`, `linear`); CUDA decomposes them differently
  (fused dropout, fused attention, autocast casts). They are installed for the meta device's
  autograd key during a capture, so they apply wherever the op is called from (Python or C++);
- function rules: replace a top-level torch function call in the job's own code (used for the
  autocast of ops with their own autograd kernels, e.g. `torch.mm`);
- fused kernels: ops that decompose on meta into several temporaries but run as one CUDA kernel:
  a meta kernel that only allocates the CUDA kernel's outputs;
- host outputs: outputs of an op that CUDA keeps on the host (e.g. an RNG seed), so they are not
  device allocations although meta makes them meta tensors;
- runtime patches: context managers that make Python-level CUDA defaults apply (e.g. optimizers
  default to `foreach` on CUDA).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from peakmem.profiles import GpuProfile, StackProfile


class RuleContext(Protocol):
    """What a rule may ask of the capture."""

    gpu: GpuProfile
    stack: StackProfile

    @property
    def in_backward(self) -> bool:
        """True while autograd's backward runs (on CUDA: autograd's own device thread)."""

    def persistent(self, key: Any, nbytes: int, *, category: str, op: str) -> bool:
        """Allocate `nbytes` once per `key`, never freed; True if it was allocated now."""

    def first_time(self, key: Any) -> bool:
        """True the first time `key` is seen in this capture (a library's per-shape cache)."""

    def read_once(self, key: Any, read: Callable[[], Any]) -> Any:
        """`read()` the first time `key` is asked for in this capture, that value ever after: a
        C++ function-local static, e.g. an environment variable ATen reads once per process."""

    def load_library(self, family: str) -> None:
        """A library/kernel family is used: its device memory outside the caching allocator
        (handles, lazily loaded kernel images; stack profile `library_bytes`) counts from now."""

    def transient(
        self, nbytes: int, *, category: str, op: str, or_smaller: bool = False
    ) -> None:
        """Allocate `nbytes` and free it right away (scratch inside one kernel). `or_smaller`:
        under memory pressure the kernel makes do with a smaller workspace (halved until it
        fits), as cuDNN falls back to plans with smaller workspaces."""

    def scratch(self, nbytes: int, *, category: str, op: str) -> int:
        """Allocate `nbytes` now; returns an id for `release`."""

    def release(self, ident: int) -> None:
        """Free an allocation made with `scratch`."""

    def empty_cache(self) -> None:
        """The kernel's library empties the caching allocator's cache (`emptyCache()`)."""


OpRule = Callable[..., Any]
"""rule(ctx, op, args, kwargs, out) called after the op's outputs were recorded, or a generator
rule(ctx, op, args, kwargs) that yields once: `out = yield` (see the module docstring)."""
FunctionRule = Callable[[RuleContext, Callable, tuple, dict], Any]
FusedKernel = Callable[..., Any]
CompositeRule = Callable[..., Any]
"""rule(ctx, op, *args, **kwargs): `op` is the OpOverload; `op.decompose(...)` runs the default."""
RuntimePatch = Callable[[], AbstractContextManager[None]]
HostOutputs = Callable[[Any], Iterable[Any]]

OP_RULES: dict[Any, OpRule] = {}
FUNCTION_RULES: dict[Callable, FunctionRule] = {}
FUSED_KERNELS: dict[str, FusedKernel] = {}
LAYOUT_PURE_FUSED_KERNELS: set[str] = set()
"""Names in FUSED_KERNELS whose output is a pure function of the arguments' metadata (shapes,
strides, dtypes, flags: what capture/meta_cache.py keys a call by), so the meta cache may keep
their results like any op's (it still runs the kernel itself on a miss)."""
SPARSE_KERNELS: dict[str, FusedKernel] = {}
"""Meta kernels for aten ops on sparse fake tensors (the SparseMeta key), which torch lacks."""
SPARSE_COMPRESSED_KERNELS: dict[str, FusedKernel] = {}
"""... and on sparse CSR / CSC fake tensors (the SparseCsrMeta key)."""
COMPOSITE_RULES: dict[str, CompositeRule] = {}
RUNTIME_PATCHES: dict[str, RuntimePatch] = {}
HOST_OUTPUTS: dict[Any, HostOutputs] = {}
OUTPUT_ORDER: dict[Any, tuple[int, ...]] = {}
"""Per op: the order in which its CUDA kernel allocates its outputs (indexes into the op's
flattened outputs), where it is not the order the op returns them in."""


class DuplicateRuleError(ValueError):
    """Two rules registered for the same op or function."""


def _as_list(targets: Any) -> list:
    return list(targets) if isinstance(targets, (list, tuple, set)) else [targets]


def _register(registry: dict, keys: Iterable, value: Any, what: str) -> None:
    for key in keys:
        if key in registry:
            raise DuplicateRuleError(f"{what} for {key!r} is already registered")
        registry[key] = value


def register_op_rule(ops: Any) -> Callable[[OpRule], OpRule]:
    """Decorate `rule(ctx, op, args, kwargs, out)` to run after each of `ops` (OpOverload or
    OpOverloadPacket; a packet covers all its overloads)."""

    def decorator(rule: OpRule) -> OpRule:
        _register(OP_RULES, _as_list(ops), rule, "an op rule")
        return rule

    return decorator


def register_function_rule(funcs: Any) -> Callable[[FunctionRule], FunctionRule]:
    """Decorate `rule(ctx, func, args, kwargs) -> result` to replace calls of `funcs` on device
    tensors; return `NotImplemented` to let the call run unchanged."""

    def decorator(rule: FunctionRule) -> FunctionRule:
        _register(FUNCTION_RULES, _as_list(funcs), rule, "a function rule")
        return rule

    return decorator


def register_composite_rule(op_names: Any) -> Callable[[CompositeRule], CompositeRule]:
    """Decorate `rule(ctx, op, *args, **kwargs)` for aten ops given by name ("dropout",
    "softmax.int"); it replaces the op's composite decomposition on the capture device."""

    def decorator(rule: CompositeRule) -> CompositeRule:
        _register(COMPOSITE_RULES, _as_list(op_names), rule, "a composite rule")
        return rule

    return decorator


def register_fused_kernel(
    op_names: Any, layout_pure: bool = False
) -> Callable[[FusedKernel], FusedKernel]:
    """Decorate a meta kernel for aten ops (names like "mish_backward") that CUDA runs as one
    kernel but meta would decompose. `layout_pure`: its output depends only on the arguments'
    metadata (LAYOUT_PURE_FUSED_KERNELS), so the meta cache may keep it."""

    def decorator(kernel: FusedKernel) -> FusedKernel:
        names = _as_list(op_names)
        _register(FUSED_KERNELS, names, kernel, "a fused kernel")
        if layout_pure:
            LAYOUT_PURE_FUSED_KERNELS.update(names)
        return kernel

    return decorator


def register_sparse_kernel(op_names: Any) -> Callable[[FusedKernel], FusedKernel]:
    """Decorate a kernel for aten ops ("mm") called with a sparse fake tensor (torch has no
    SparseMeta kernel for them): it allocates what the CUDA kernel returns."""

    def decorator(kernel: FusedKernel) -> FusedKernel:
        _register(SPARSE_KERNELS, _as_list(op_names), kernel, "a sparse kernel")
        return kernel

    return decorator


def register_sparse_compressed_kernel(op_names: Any) -> Callable[[FusedKernel], FusedKernel]:
    """Decorate a kernel for aten ops ("addmm") called with a sparse CSR / CSC fake tensor
    (torch has no SparseCsrMeta kernel for them): it allocates what the CUDA kernel returns."""

    def decorator(kernel: FusedKernel) -> FusedKernel:
        _register(SPARSE_COMPRESSED_KERNELS, _as_list(op_names), kernel, "a sparse compressed kernel")
        return kernel

    return decorator


def register_host_outputs(ops: Any) -> Callable[[HostOutputs], HostOutputs]:
    """Decorate `select(out) -> tensors` naming the outputs of `ops` that live on the host."""

    def decorator(select: HostOutputs) -> HostOutputs:
        _register(HOST_OUTPUTS, _as_list(ops), select, "a host-outputs rule")
        return select

    return decorator


def register_output_order(ops: Any, order: tuple[int, ...]) -> None:
    """The CUDA kernel of `ops` allocates its outputs in `order` (indexes of the returned
    outputs, flattened): the recorder emits their allocations in that order."""
    _register(OUTPUT_ORDER, _as_list(ops), tuple(order), "an output order")


def output_order_for(op: Any) -> tuple[int, ...] | None:
    return _lookup(OUTPUT_ORDER, op)


def register_runtime_patch(name: str) -> Callable[[RuntimePatch], RuntimePatch]:
    """Decorate a context-manager factory that is active for the whole capture."""

    def decorator(patch: RuntimePatch) -> RuntimePatch:
        _register(RUNTIME_PATCHES, [name], patch, "a runtime patch")
        return patch

    return decorator


def _lookup(registry: dict, op: Any) -> Any:
    found = registry.get(op)
    if found is None:
        packet = getattr(op, "overloadpacket", None)
        if packet is not None:
            found = registry.get(packet)
    return found


def op_rule_for(op: Any) -> OpRule | None:
    return _lookup(OP_RULES, op)


def host_outputs_for(op: Any) -> HostOutputs | None:
    return _lookup(HOST_OUTPUTS, op)


def iter_rules() -> Iterator[tuple[str, Any]]:
    """(kind, key) for every registered rule, for listings and tests."""
    for kind, registry in (
        ("op", OP_RULES),
        ("function", FUNCTION_RULES),
        ("composite", COMPOSITE_RULES),
        ("fused", FUSED_KERNELS),
        ("host_outputs", HOST_OUTPUTS),
        ("output_order", OUTPUT_ORDER),
        ("patch", RUNTIME_PATCHES),
    ):
        for key in registry:
            yield kind, key
