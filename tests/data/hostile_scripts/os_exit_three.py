# os._exit(3) before the estimate -> job_failed / os_exit, job_exit_code 3
import os

print("about to os._exit(3)")
os._exit(3)
