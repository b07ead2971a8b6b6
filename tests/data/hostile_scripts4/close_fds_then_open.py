# trains, closes every descriptor above stderr, then opens files of its own (which take the
# freed numbers): peakmem's result must go to its own file, never into the job's
import os

from _train import train

train()
os.closerange(3, 1 << 16)
handles = [open(f"mine{i}.txt", "w") for i in range(8)]  # noqa: SIM115
for handle in handles:
    handle.write("the job's own file\n")
    handle.flush()
