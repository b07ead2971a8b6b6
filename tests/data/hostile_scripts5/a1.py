import atexit, time
from _train import train
train()
atexit.register(lambda: time.sleep(3600))
