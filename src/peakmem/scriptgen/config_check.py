"""The `--model` config as transformers builds it, checked in the job's process: the script
`peakmem estimate --model` runs calls `built_config` where the printed script calls
`AutoConfig.for_model`. A model type transformers does not know, or a value it refuses
(`"n_embd": "big"`), is a ConfigError there (one line naming the field: the capture reports a
JobInputError as bad input, exit code 2), not a job failure with a traceback. Here and not in
the estimate's own process, which never imports transformers or torch (checking there cost
seconds on every `--model` estimate); the job imports both anyway."""

from __future__ import annotations

from typing import Any

from peakmem.scriptgen.config_source import ConfigError, check_config


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
