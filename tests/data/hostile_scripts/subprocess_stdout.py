# a subprocess writes to fd 1: it must not reach peakmem's stdout
import subprocess
import sys

subprocess.run(["echo", "SUBPROCESS-STDOUT"], check=True)
subprocess.run([sys.executable, "-c", "print('PYTHON-SUBPROCESS-STDOUT')"], check=True)
