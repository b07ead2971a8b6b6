# trains, then leaves a grandchild in its own session that stops itself (SIGSTOP) and whose
# parent exits at once (an orphan); the job then ends normally
import os
import signal
import sys
import time

from _train import train

train()
pid_file = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(pid_file + ".tmp", "w") as handle:
            handle.write(str(os.getpid()))
        os.replace(pid_file + ".tmp", pid_file)
        os.kill(os.getpid(), signal.SIGSTOP)
        os._exit(0)
    os._exit(0)
os.wait()
while not os.path.exists(pid_file):
    time.sleep(0.01)
time.sleep(0.2)
