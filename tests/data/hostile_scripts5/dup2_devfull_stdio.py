# trains, then points stdout and stderr at /dev/full and closes stdin, and prints
import os

from _train import train

train()
full = os.open("/dev/full", os.O_WRONLY)
os.dup2(full, 1)
os.dup2(full, 2)
os.close(0)
print("x" * 100000)
