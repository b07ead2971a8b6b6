"""The vocabulary every stage shares: what a piece of device memory holds, and when it was made."""

from enum import StrEnum


class Category(StrEnum):
    """What a device allocation holds."""

    PARAMETER = "parameter"
    """Model weights (nn.Parameter storage)."""
    BUFFER = "buffer"
    """Module buffers (BatchNorm running stats, ...)."""
    GRADIENT = "gradient"
    """`.grad` of parameters."""
    OPTIMIZER_STATE = "optimizer_state"
    """Optimizer state (Adam moments, momentum buffers, step counters)."""
    ACTIVATION = "activation"
    """Tensors saved by autograd for the backward pass."""
    TEMPORARY = "temporary"
    """Short-lived intermediates: freed within the op or phase that made them."""
    INPUT = "input"
    """The input batch and targets copied to the device."""
    WORKSPACE = "workspace"
    """Library scratch (cuBLAS, cuBLASLt, cuDNN, SDPA kernels) taken from the caching allocator."""
    COMMUNICATION = "communication"
    """Buffers of collectives: DDP's gradient buckets (a second copy of the gradients with the
    default `gradient_as_bucket_view=False`), FSDP's all-gather and reduce-scatter buffers, the
    flattened buffers NCCL makes for list collectives (capture.collective_buffers)."""
    EMA = "ema"
    """Copies of the trained weights kept in sync with them and stepped by no optimizer (EMA /
    averaged models: diffusers' EMAModel, timm's ModelEma, swa_utils.AveragedModel, a
    `deepcopy(model)` updated with `lerp_` / `mul_().add_()`; capture.weight_copies)."""
    OTHER = "other"
    """Anything not classified."""


class Phase(StrEnum):
    """When in a training step an allocation was made."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    OTHER = "other"


class Mark(StrEnum):
    """Labels of MARK events besides the step marks ("forward", "backward", "optimizer",
    "step N")."""

    EVAL = "eval"
    """A forward pass without gradients after training starts an evaluation."""
    LOOP_ENDED = "training loop ended"
    """The capture ended the training loop early (its DataLoader stopped); what follows runs."""
    STOPPED = "stopped"
    """The capture stopped the job before its end."""
    COMPILED = "compiled region"
    """A torch.compile'd module or function starts (it runs eagerly in the capture)."""
    COMPILED_END = "compiled region end"
