# SystemExit in a thread is ignored by python; then the main thread raises a custom error
import threading


def worker():
    raise SystemExit(9)


t = threading.Thread(target=worker)
t.start()
t.join()
raise LookupError("main thread failed")
