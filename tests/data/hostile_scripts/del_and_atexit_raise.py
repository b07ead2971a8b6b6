# raising in __del__ and in an atexit handler after a normal run
import atexit


class Leaky:
    def __del__(self):
        raise RuntimeError("raised in __del__")


def handler():
    raise RuntimeError("raised in atexit")


atexit.register(handler)
keep = Leaky()
other = Leaky()
del other
