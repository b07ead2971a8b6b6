# trains, then writes a line to every file descriptor it has open (a crude "flush all logs"):
# peakmem's result file was among them, and the result landed after the job's line (bad_result)
import contextlib
import os

from _train import train

train()
for name in os.listdir("/proc/self/fd"):
    with contextlib.suppress(OSError):
        os.write(int(name), b"the job's line\n")
