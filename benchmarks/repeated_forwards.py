"""Repeated no-grad forwards (issue 14, capture.repeated_forwards): each job estimated with the
replay off and on, side by side in this process; prints the seconds of each, the calls
replayed, and whether the estimate JSON (but its seconds and the replay note), every trace
event and tag, and the utilization record are the same. Exits 1 on any difference.

    python benchmarks/repeated_forwards.py [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "library_jobs" / "scripts"
sys.path.insert(0, str(ROOT / "benchmarks"))

from speed_regression import trace_digest, utilization_digest  # noqa: E402

from peakmem.capture.repeated_forwards import ENV_FLAG  # noqa: E402
from peakmem.estimate import estimate_command  # noqa: E402

REPLAYED = "no-grad forward call(s) replayed"


def shakespeare(path: Path) -> None:
    """tests/library_jobs/test_library_jobs_r19b.py's input.txt."""
    rng = random.Random(0)
    words = ["thou", "art", "the", "king", "and", "queen", "of", "all", "that", "is", "Romeo",
             "JULIET:", "my", "lord,", "good", "night!"]
    path.write_text("\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
                              for _ in range(400)) + "\n")


# (name, script, arguments, gpu, setup of the working directory)
JOBS = [
    ("r19b-ng-video-lecture-gpt", "r19b_ng_video_lecture_gpt.py", [], "h100-80gb",
     lambda d: shakespeare(d / "input.txt")),
]


def one(script: str, args: list[str], gpu: str, cwd: Path, replay: bool) -> tuple[dict, float]:
    os.environ[ENV_FLAG] = "1" if replay else "0"
    here = Path.cwd()
    os.chdir(cwd)
    try:
        begin = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            result = estimate_command(["python", str(SCRIPTS / script), *args], gpu=gpu,
                                      mode="fake", isolate=False, timeout=900)
        seconds = time.perf_counter() - begin
    finally:
        os.chdir(here)
        os.environ.pop(ENV_FLAG, None)
    data = result.to_json()
    data.pop("seconds", None)
    notes = data.pop("notes", [])
    data["notes"] = [n for n in notes if REPLAYED not in n]
    data["trace_digest"] = trace_digest(result.capture.trace)
    data["utilization_digest"] = utilization_digest(result)
    replayed = [int(n.split()[0]) for n in notes if REPLAYED in n]
    data["_replayed"] = replayed[0] if replayed else 0
    return data, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="")
    options = parser.parse_args()
    failed = 0
    for name, script, args, gpu, setup in JOBS:
        if options.only not in name:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            setup(Path(tmp))
            off, off_s = one(script, args, gpu, Path(tmp), replay=False)
            on, on_s = one(script, args, gpu, Path(tmp), replay=True)
        replayed = on.pop("_replayed")
        off.pop("_replayed")
        same = on == off
        failed += not same
        print(json.dumps({"job": name, "seconds_off": round(off_s, 1), "seconds_on": round(on_s, 1),
                          "replayed": replayed, "identical": same,
                          "peak_bytes": on.get("peak_bytes")}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
