"""run_glue_no_trainer.py (hf_ex_run_glue_no_trainer.py, unchanged) with its metric computed by
hand: `evaluate` is not installed, so a module of that name whose `load(...)` returns an
accuracy metric (add_batch / compute, as evaluate's) is put in sys.modules first, and the
script runs as __main__ with this script's arguments."""

import runpy
import sys
import types
from pathlib import Path


class Accuracy:
    """evaluate's metric interface: batches of predictions and references, then compute()."""

    def __init__(self):
        self.correct = 0
        self.total = 0

    def add_batch(self, predictions, references):
        self.correct += int((predictions == references).sum())
        self.total += len(references)

    def compute(self):
        accuracy = self.correct / max(self.total, 1)
        self.correct = self.total = 0
        return {"accuracy": accuracy}


def load(path, config_name=None, **kwargs):
    return Accuracy()


evaluate = types.ModuleType("evaluate")
evaluate.load = load
sys.modules["evaluate"] = evaluate

script = Path(__file__).with_name("hf_ex_run_glue_no_trainer.py")
sys.argv[0] = str(script)
runpy.run_path(str(script), run_name="__main__")
