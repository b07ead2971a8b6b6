# trains, then ends its process with os._exit(0): the trace so far is delivered first -> exit 0
import os

from _train import train

train(2)
os._exit(0)
