# an exception class with a non-string __module__, a raising __str__, and a raising __cause__'s str
class Cause(Exception):
    def __str__(self):
        raise RuntimeError("cause str")


class Weird(Exception):
    __module__ = 42

    def __str__(self):
        raise RuntimeError("weird str")


try:
    raise Cause()
except Cause as cause:
    raise Weird() from cause
