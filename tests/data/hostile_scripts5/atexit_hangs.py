# trains, registers an atexit handler that never returns (python waits for it for ever) and
# leaves a non-daemon thread running: the capture was over, peakmem waited until --timeout
import atexit
import threading
import time

from _train import train

train()
atexit.register(time.sleep, 3600)  # a builtin: the library's kind, left to the real atexit


@atexit.register
def never_returns():
    time.sleep(3600)


threading.Thread(target=time.sleep, args=(3600,)).start()
