# trains, registers an atexit handler that never returns and leaves a non-daemon thread
import atexit
import threading
import time

from _train import train

train()
atexit.register(lambda: time.sleep(3600))
threading.Thread(target=time.sleep, args=(3600,)).start()
