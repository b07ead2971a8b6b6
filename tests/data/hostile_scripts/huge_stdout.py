# 8 MB of prints: all of it must stay off peakmem's stdout (and not block the job)
import sys

line = "x" * 1023
for _ in range(8 * 1024):
    print(line)
sys.stdout.flush()
