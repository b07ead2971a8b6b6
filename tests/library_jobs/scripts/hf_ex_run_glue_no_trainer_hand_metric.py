"""run_glue_no_trainer.py (hf_ex_run_glue_no_trainer.py, unchanged) with its metric computed by
hand: r4_hand_metric.py (a module named `evaluate` whose `load(...)` returns an accuracy metric)
runs it as __main__ with this script's arguments."""

import runpy
import sys
from pathlib import Path

runner = Path(__file__).with_name("r4_hand_metric.py")
sys.argv = [str(runner), "hf_ex_run_glue_no_trainer.py", *sys.argv[1:]]
runpy.run_path(str(runner), run_name="__main__")
