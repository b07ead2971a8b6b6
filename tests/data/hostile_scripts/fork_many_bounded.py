# forks 4 children that sleep long (bounded, no bomb); the job itself ends at once:
# peakmem must not wait for them, and ends them with the job's process group
import os
import time

for _ in range(4):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
print("parent done")
