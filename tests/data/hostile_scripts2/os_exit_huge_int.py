# os._exit with an int no C int holds raises OverflowError (python's own), the job goes on
import os
import sys

from _train import train

train()
try:
    os._exit(10**100)
except OverflowError:
    sys.exit(7)
