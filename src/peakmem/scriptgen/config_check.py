"""The `--model` config as transformers builds it, checked in the job's process: the script
`peakmem estimate --model` runs calls `built_config` where the printed script calls
`AutoConfig.for_model`. A model type transformers does not know, or a value it refuses
(`"n_embd": "big"`), is a ConfigError there (one line naming the field: the capture reports a
JobInputError as bad input, exit code 2), not a job failure with a traceback. Here and not in
the estimate's own process, which never imports transformers or torch (checking there cost
seconds on every `--model` estimate); the job imports both anyway."""

from __future__ import annotations

import re
from typing import Any

from peakmem.scriptgen.config_source import _SIZE_KEY, ConfigError, check_config


def built_config(config: dict[str, Any], source: str) -> Any:
    """`AutoConfig.for_model(model_type, **rest)` of `config`; ConfigError (one line) where
    transformers does not know the model type (no `trust_remote_code`) or refuses a value."""
    check_config(config, source)
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    settings = dict(config)
    model_type = settings.pop("model_type")
    if model_type not in CONFIG_MAPPING_NAMES:
        raise ConfigError(
            f"--model {source}: model_type {model_type[:60]!r} is not one transformers knows "
            "(models that need trust_remote_code are not built)")
    try:
        return AutoConfig.for_model(model_type, **settings)
    except ImportError:  # the model's module cannot be imported: the job's own failure
        raise
    except Exception as exc:  # noqa: BLE001 - transformers' validation errors have no common base
        message = " ".join(str(exc).split())[:300]
        raise ConfigError(f"--model {source}: transformers refuses the config: "
                          f"{type(exc).__name__}: {message}") from None


_OVERFLOW = re.compile(r"overflow", re.IGNORECASE)
"""torch's refusal of a shape whose element count or byte size is past int64 (c10's `numel:
integer multiplication overflow`, `Storage size calculation overflowed`)."""


def built_model(auto_class: Any, config: Any, source: str) -> Any:
    """`auto_class.from_config(config)`, with the refusals that only the model's construction
    finds reported as bad input (ConfigError, one line): a tensor the config's sizes make too
    large for torch's int64 element count (`vocab_size` x `n_embd` past 2**63; each field alone
    passes the range check), and a transformers model's own ValueError on the config
    (`embed_dim` not divisible by `num_heads`). Before, both were the job's failure: exit 1 after
    a 30-line traceback. Anything else raised here is still the job's own error."""
    try:
        return auto_class.from_config(config)
    except RuntimeError as exc:
        if not _OVERFLOW.search(str(exc)):
            raise
        raise ConfigError(f"--model {source}: the config's sizes make a tensor too large for "
                          f"torch (largest: {_largest_sizes(config)}): "
                          f"{_one_line(exc)}") from None
    except ValueError as exc:
        if not _raised_in_transformers(exc):
            raise
        raise ConfigError(f"--model {source}: transformers refuses the config: "
                          f"{type(exc).__name__}: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def _raised_in_transformers(exc: BaseException) -> bool:
    """Whether the innermost frame of `exc`'s traceback is transformers' code (its check of
    the config), not torch's, peft's or peakmem's."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return "/transformers/" in tb.tb_frame.f_code.co_filename.replace("\\", "/")


def _largest_sizes(config: Any) -> str:
    """The config's two largest size fields, `'n_embd' 1099511627776, 'vocab_size' ...`."""
    values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    sizes = sorted(((value, key) for key, value in values.items()
                    if type(value) is int and _SIZE_KEY.search(str(key))), reverse=True)
    return ", ".join(f"{key[:60]!r} {value}" for value, key in sizes[:2]) or "no size field"
