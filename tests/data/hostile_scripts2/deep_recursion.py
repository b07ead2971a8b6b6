# a recursion a million frames deep: python prints its last 1000 frames at once
import sys

sys.setrecursionlimit(10**6)


def down(depth):
    return down(depth + 1)


down(0)
