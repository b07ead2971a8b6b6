"""Lightning's FSDP strategy reloading a checkpoint into the model `fit` already wrapped.

`trainer.fit(model)` with `strategy="fsdp"` (FSDPStrategy) and then, in the same process,
`trainer.validate/test/predict(model, ckpt_path="best")` fails at the checkpoint load: the second
setup finds the model already wrapped ("A FSDP `auto_wrap_policy` is set, but the model is
already wrapped. The policy will be ignored.") and the full checkpoint meets the flattened
shards ("size mismatch for embed.weight: copying a param with shape torch.Size([256, 128])
from checkpoint, the shape in current model is torch.Size([32768])"). That is Lightning's own
behaviour, reported on GPUs as Lightning-AI/pytorch-lightning#20373 (open), not the fake
device's: the job fails as it would there, and its one-line error says so
(`CaptureSession.failure_hints`) instead of leaving the reader to suspect peakmem.

Recognised when `FSDPStrategy.load_checkpoint` raises a size mismatch while the strategy is set
up a second time for a LightningModule it set up before in this process.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from peakmem.capture.library_patches import register_library_patch
from peakmem.capture.on_import import Undo, patch_on_import

FSDP_STRATEGY_MODULES = (
    "lightning.pytorch.strategies.fsdp",
    "pytorch_lightning.strategies.fsdp",
)
ISSUE = "Lightning-AI/pytorch-lightning#20373"
HINT = (
    "Lightning's FSDPStrategy loaded ckpt_path into the model that fit already wrapped "
    "(validate / test / predict after fit in one process): a known Lightning bug that fails on "
    f"GPUs too ({ISSUE}); without that call peakmem estimates fit, or make it on a new Trainer "
    "and model"
)
_AGAIN = "_peakmem_set_up_again"


def _wrap(module: Any) -> Undo:
    cls = getattr(module, "FSDPStrategy", None)
    setup = vars(cls).get("setup") if isinstance(cls, type) else None
    load = vars(cls).get("load_checkpoint") if isinstance(cls, type) else None
    if setup is None or load is None:
        return lambda: None
    set_up: weakref.WeakSet = weakref.WeakSet()

    def setup_wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        model = getattr(self, "lightning_module", None)
        if model is not None:
            setattr(self, _AGAIN, model in set_up)
            set_up.add(model)
        return setup(self, *args, **kwargs)

    def load_wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return load(self, *args, **kwargs)
        except RuntimeError as exc:
            if getattr(self, _AGAIN, False) and "size mismatch" in str(exc):
                _add_hint()
            raise

    cls.setup, cls.load_checkpoint = setup_wrapper, load_wrapper

    def undo() -> None:
        cls.setup, cls.load_checkpoint = setup, load

    return undo


def _add_hint() -> None:
    from peakmem.capture.running_session import session_on_mode_stack as current_session

    session = current_session()
    if session is not None and HINT not in session.failure_hints:
        session.failure_hints.append(HINT)


@register_library_patch("lightning_fsdp_reload")
@contextmanager
def lightning_fsdp_reload() -> Iterator[None]:
    with ExitStack() as stack:
        for name in FSDP_STRATEGY_MODULES:
            stack.enter_context(patch_on_import(name, _wrap))
        yield
