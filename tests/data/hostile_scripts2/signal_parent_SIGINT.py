# the job signals its parent (peakmem) and trains on: peakmem must not die of it
import os
import signal

from _train import train

os.kill(os.getppid(), signal.SIGINT)
train()
