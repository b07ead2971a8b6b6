# an exception whose __str__ and __repr__ raise, and whose __str__ returns a non-string first
class Nasty(Exception):
    def __str__(self):
        return 42

    def __repr__(self):
        raise ValueError("no repr")


raise Nasty("x")
