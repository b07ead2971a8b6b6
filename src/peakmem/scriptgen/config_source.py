"""Find a transformers `config.json`: a file, a local model directory, or a Hub id resolved from
the local Hugging Face cache (fetching only `config.json` when online, never weights, never
code). The file is untrusted: read as JSON under a size cap, checked to be an object with a
`model_type` and no value a tensor shape could not hold. Nothing here imports transformers
(or torch): what needs it, the model type being one transformers knows and transformers
building the config, is checked in the job (scriptgen.config_check), whose process imports
them anyway."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from peakmem.inputs import JobInputError

MAX_CONFIG_BYTES = 4 * 2**20
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")


class ConfigError(JobInputError):
    """The model config cannot be found or is not a usable transformers config (raised in the
    job by config_check: bad input, not the job's failure)."""


def _hub_config(repo_id: str) -> str | None:
    """The cached config.json of a Hub model, else (online only) that one file downloaded."""
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
    except ImportError:
        return None
    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        return cached
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return None
    try:
        return hf_hub_download(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - offline, unknown repo, gated: all mean "not found"
        return None


def find_config(source: str) -> tuple[dict[str, Any], str]:
    """(the config dict, where it came from) for a config.json path, a model directory or a
    Hub id; ConfigError (one line) otherwise."""
    path = Path(source).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"--model {source}: the directory has no config.json")
    elif not path.is_file():
        found = _hub_config(source) if _HUB_ID.match(source) else None
        if found is None:
            raise ConfigError(
                f"--model {source}: not a config.json, a model directory, or a Hub model id in "
                "the local Hugging Face cache (online, only its config.json is fetched)")
        path = Path(found)
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(f"--model {source}: {path.name} is {size} bytes, more than a "
                              f"config ({MAX_CONFIG_BYTES} at most)")
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"--model {source}: {path} is not a JSON config ({exc})") from None
    except RecursionError:
        raise ConfigError(f"--model {source}: {path} is not a JSON config (nested too "
                          "deeply)") from None
    check_config(config, source)
    return config, str(path)


def check_config(config: Any, source: str) -> None:
    """A dict with a `model_type` and usable values, transformers installed; ConfigError
    otherwise. (Whether transformers knows the model type and builds the config is checked
    where the job runs: config_check.built_config.)"""
    import importlib.util

    if not isinstance(config, dict):
        raise ConfigError(f"--model {source}: the config is not a JSON object")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError(f"--model {source}: the config has no model_type")
    if importlib.util.find_spec("transformers") is None:  # found, not imported
        raise ConfigError("--model needs transformers (pip install 'peakmem[hf]')")
    _check_values(config, source)


_LARGEST_SIZE = 2**40
"""No config field that sizes a tensor (hidden_size, vocab_size, n_layer...) is near this: a
larger one overflows torch's int64 shapes or the job's memory before any estimate."""


_SIZE_KEY = re.compile(r"^(n|num)_|_(size|dim|layers|heads|embeddings|positions)$|^(d_model|n_embd)$")
"""Config keys that size a tensor or count layers and heads (hidden_size, n_embd, num_layers,
max_position_embeddings...); token ids and windows may be -1, these may not."""


def _check_values(config: dict[str, Any], source: str) -> None:
    """No number a tensor shape could not hold (`"n_embd": NaN`, `10**20`, a negative size);
    ConfigError, one line, otherwise. Before, these failed inside the job, as a job failure
    with a 30-line traceback."""
    for key, value in config.items():
        if type(value) is int and not -_LARGEST_SIZE <= value <= _LARGEST_SIZE:
            raise ConfigError(f"--model {source}: {key[:60]!r} is {_shown(value)}, out of any "
                              f"model's range (at most {_LARGEST_SIZE})")
        if type(value) is float and not math.isfinite(value):
            raise ConfigError(f"--model {source}: {key[:60]!r} is {value}, not a finite number")
        if type(value) is int and value < 0 and _SIZE_KEY.search(key):
            raise ConfigError(f"--model {source}: {key[:60]!r} is {value}: a size or count "
                              "is not negative")


def _shown(value: int) -> str:
    text = str(value) if value.bit_length() < 200 else f"a {value.bit_length()}-bit integer"
    return text[:60]
