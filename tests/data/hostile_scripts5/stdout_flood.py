# trains, then writes 64 MiB to its stdout, and fails (exit 3) when what it wrote was kept in a
# file (its stdout a regular file that large): a job writing 10 GB filled the disk
import os
import sys

from _train import train

train(1)
block = b"x" * 2**20
for _ in range(64):
    os.write(1, block)
if os.fstat(1).st_size >= 64 * 2**20:
    sys.exit(3)
