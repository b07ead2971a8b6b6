# a hostile job that deletes peakmem's private directory (request and result): no result
import os
import shutil

args = open("/proc/self/cmdline", "rb").read().split(b"\0")
request = [a for a in args if a.endswith(b"request.json")][0].decode()
shutil.rmtree(os.path.dirname(request))
