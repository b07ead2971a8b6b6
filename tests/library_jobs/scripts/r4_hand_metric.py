"""`python r4_hand_metric.py SCRIPT ARGS...`: runs SCRIPT (next to this file) unchanged as
__main__ with ARGS, with `evaluate.load(...)` answered by an accuracy metric computed by hand
(add_batch / compute, as evaluate's): `evaluate` is not installed and its GLUE metric is a
download (hf_ex_run_glue_no_trainer_hand_metric.py does the same for one script)."""

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

    def compute(self, predictions=None, references=None):
        if predictions is not None:  # evaluate's one-shot form: these batches alone
            self.add_batch(predictions=predictions, references=references)
        accuracy = self.correct / max(self.total, 1)
        self.correct = self.total = 0
        return {"accuracy": accuracy}


def load(path, config_name=None, **kwargs):
    return Accuracy()


evaluate = types.ModuleType("evaluate")
evaluate.load = load
sys.modules["evaluate"] = evaluate

script = Path(__file__).with_name(sys.argv[1])
sys.argv = [str(script), *sys.argv[2:]]
runpy.run_path(str(script), run_name="__main__")
