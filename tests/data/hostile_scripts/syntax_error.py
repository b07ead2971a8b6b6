# a script that does not parse
def broken(:
    pass
