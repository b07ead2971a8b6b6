# trains, then raises SystemExit with objects that are not ints
import sys

from _train import train


class Weird:
    def __repr__(self):
        raise RuntimeError("no repr")

    def __str__(self):
        raise RuntimeError("no str")


train()
raise SystemExit({"a": [1, 2]} if sys.argv[1] == "dict" else Weird())
