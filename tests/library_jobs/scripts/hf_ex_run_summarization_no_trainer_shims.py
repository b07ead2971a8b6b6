"""run_summarization_no_trainer.py (hf_ex_run_summarization_no_trainer.py, unchanged) with the
two packages it imports and that are not installed here stood in for: `evaluate` (its ROUGE
becomes a unigram-overlap F1 counted by hand) and `nltk` (`sent_tokenize` splits on ". ";
`data.find` finds punkt). The script runs as __main__ with this script's arguments.
HF_EX_SHIMS=evaluate stands in for `evaluate` only (the script then stops at `import nltk`)."""

import os
import runpy
import sys
import types
from pathlib import Path


class UnigramRouge:
    def __init__(self):
        self.scores = []

    def add_batch(self, predictions, references):
        for prediction, reference in zip(predictions, references, strict=True):
            pred, ref = set(prediction.split()), set(reference.split())
            overlap = len(pred & ref)
            self.scores.append(2 * overlap / max(len(pred) + len(ref), 1))

    def compute(self, **kwargs):
        score = sum(self.scores) / max(len(self.scores), 1)
        self.scores = []
        return {"rouge1": score}


evaluate = types.ModuleType("evaluate")
evaluate.load = lambda path, *args, **kwargs: UnigramRouge()
nltk = types.ModuleType("nltk")
nltk.data = types.SimpleNamespace(find=lambda name: name)
nltk.download = lambda *args, **kwargs: True
nltk.sent_tokenize = lambda text: [part for part in text.split(". ") if part]
shims = {"evaluate": evaluate, "nltk": nltk}
wanted = os.environ.get("HF_EX_SHIMS", "evaluate,nltk").split(",")
sys.modules.update({name: shims[name] for name in wanted})

script = Path(__file__).with_name("hf_ex_run_summarization_no_trainer.py")
sys.argv[0] = str(script)
runpy.run_path(str(script), run_name="__main__")
