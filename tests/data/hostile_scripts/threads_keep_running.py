# a non-daemon thread that never ends: the estimate must not wait for it
import threading
import time


def spin():
    while True:
        time.sleep(0.1)


threading.Thread(target=spin).start()
print("main thread done")
