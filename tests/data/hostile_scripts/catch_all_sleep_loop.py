# an endless loop that catches every exception (an in-process alarm could never stop it)
import time

while True:
    try:
        time.sleep(0.01)
    except BaseException:  # noqa: BLE001
        pass
