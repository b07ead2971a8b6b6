# sys.exit with an int no C long holds: python exits with -1 (status 255)
import sys

from _train import train

train()
sys.exit(10**100)
