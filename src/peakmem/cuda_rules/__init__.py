"""CUDA semantics for the capture: one module per op family, one registered rule per op.

Importing this package loads every rule module (their decorators fill the registries)."""

from peakmem.cuda_rules import (  # noqa: F401  (imported for their registrations)
    activations,
    autocast,
    blas,
    convolution,
    data_dependent,
    dropout,
    embedding,
    losses,
    norms,
    optimizers,
    reductions,
    saved_inputs,
    sdpa,
)
from peakmem.cuda_rules.registry import (
    COMPOSITE_RULES,
    FUNCTION_RULES,
    FUSED_KERNELS,
    HOST_OUTPUTS,
    OP_RULES,
    RUNTIME_PATCHES,
    DuplicateRuleError,
    RuleContext,
    host_outputs_for,
    iter_rules,
    op_rule_for,
    register_composite_rule,
    register_function_rule,
    register_fused_kernel,
    register_host_outputs,
    register_op_rule,
    register_runtime_patch,
)

__all__ = [
    "COMPOSITE_RULES",
    "FUNCTION_RULES",
    "FUSED_KERNELS",
    "HOST_OUTPUTS",
    "OP_RULES",
    "RUNTIME_PATCHES",
    "DuplicateRuleError",
    "RuleContext",
    "host_outputs_for",
    "iter_rules",
    "op_rule_for",
    "register_composite_rule",
    "register_function_rule",
    "register_fused_kernel",
    "register_host_outputs",
    "register_op_rule",
    "register_runtime_patch",
]
