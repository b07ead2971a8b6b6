# forks; the fork runs the rest of the script too: only one result, one estimate
import os

pid = os.fork()
print("after fork in", os.getpid(), "child" if pid == 0 else "parent")
if pid:
    os.waitpid(pid, 0)
