# trains, lowers its soft AND hard limit on file descriptors (a hard limit cannot be raised
# again) and takes every one left: a job that opens nothing more runs fine so under python
import builtins
import resource

from _train import train

train()
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
held = builtins.held_by_the_job = []  # kept past the script's end
try:
    while True:
        held.append(open("/dev/null", "rb"))  # noqa: SIM115
except OSError:
    pass
