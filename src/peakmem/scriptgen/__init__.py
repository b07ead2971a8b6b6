"""`peakmem estimate --model CONFIG`: a standard training script built for a transformers
config (`config_source` finds the config, `template` writes the script)."""

from peakmem.scriptgen.config_source import ConfigError, find_config
from peakmem.scriptgen.template import OPTIMIZERS, PRECISIONS, TASKS, TrainingSpec, render_script

__all__ = ["OPTIMIZERS", "PRECISIONS", "TASKS", "ConfigError", "TrainingSpec", "find_config",
           "render_script"]
