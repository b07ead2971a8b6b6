# a grandchild in its own session that outlives the job: ended with the job
import subprocess
import sys

subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
print("spawned")
