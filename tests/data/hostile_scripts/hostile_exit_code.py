# sys.exit() with an int subclass whose __eq__, __str__ and __repr__ raise
import sys


class Code(int):
    def __eq__(self, other):
        raise RuntimeError("no comparing")

    __hash__ = int.__hash__

    def __str__(self):
        raise RuntimeError("no str")

    __repr__ = __str__


sys.exit(Code(3))
