# ignores SIGTERM, SIGINT, SIGALRM and catches everything in an endless loop
import signal

for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN)
while True:
    try:
        sum(range(1000))
    except BaseException:  # noqa: BLE001
        pass
