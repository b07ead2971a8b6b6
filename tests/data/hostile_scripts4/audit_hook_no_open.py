# trains, then installs an audit hook (which nothing can remove) that forbids opening any file:
# a job that opens nothing more runs fine so under python, and peakmem must deliver its result
import sys

from _train import train

train()


def no_files(event, args):
    if event == "open":
        raise PermissionError(f"audit hook: {event} refused")


sys.addaudithook(no_files)
