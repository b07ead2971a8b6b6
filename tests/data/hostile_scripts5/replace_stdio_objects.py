# trains, then replaces sys.stdout / sys.stderr / sys.__stdout__ with None and builtins.print
import builtins
import sys

from _train import train

train()
sys.stdout = sys.stderr = sys.__stdout__ = sys.__stderr__ = None
builtins.print = None
