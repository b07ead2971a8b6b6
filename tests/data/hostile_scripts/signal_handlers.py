# installs its own signal handlers and ends normally
import signal


def handler(signum, frame):
    print("got", signum)


for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGCHLD):
    signal.signal(sig, handler)
signal.alarm(0)
