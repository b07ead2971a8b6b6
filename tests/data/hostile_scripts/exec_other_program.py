# replaces its process with another program (exit 0): no result -> job_failed, never exit 0
import os

os.execv("/bin/true", ["true"])
