# the job kills its own process with SIGKILL
import os
import signal

os.kill(os.getpid(), signal.SIGKILL)
