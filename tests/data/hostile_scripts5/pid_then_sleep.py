# trains, writes its pid, then sleeps a minute (the test ends it, or what it ran under)
import os
import sys
import time

from _train import train

train(1)
with open(sys.argv[1], "w") as handle:
    handle.write(str(os.getpid()))
time.sleep(60)
