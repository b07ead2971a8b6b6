# moves its working directory: peakmem's --timeline / --job-log paths must not move
import os
import tempfile

from _train import train

os.chdir(tempfile.gettempdir())
train(1)
