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
    """Tensors saved by autograd for the backward pass (what a training forward made and is
    still alive when its backward starts); in an evaluation's forward (phase `eval`), every
    block it makes (capture.phases)."""
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
    MODEL_COPY = "model_copy"
    """Copies of a model's parameters and buffers made between steps that no optimizer trains,
    no forward uses and nothing keeps in sync: best-weights snapshots
    (`copy.deepcopy(model.state_dict())`), a state_dict cloned or cast for a checkpoint, a
    `copy.deepcopy(model)` before it is trained, averaged or run (capture.model_copies)."""
    OTHER = "other"
    """Anything not classified."""


class Phase(StrEnum):
    """When in a training step an allocation was made."""

    FORWARD = "forward"
    EVAL = "eval"
    """A forward pass without gradients after training of a module in eval mode (a validation
    batch, `generate`), while its top-level module runs: what it makes is tagged `activation`
    (freed by the forward itself, or kept as its outputs); the phase ends when that module
    returns (capture.phases)."""
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
