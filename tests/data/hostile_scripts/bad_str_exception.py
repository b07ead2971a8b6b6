# an exception whose __str__ raises
class Nasty(Exception):
    def __str__(self):
        raise RuntimeError("no str for you")


raise Nasty()
