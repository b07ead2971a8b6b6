# a hostile job that finds peakmem's result file and writes garbage there, then dies
import os
import signal

args = open("/proc/self/cmdline", "rb").read().split(b"\0")
request = [a for a in args if a.endswith(b"request.json")][0].decode()
result = os.path.join(os.path.dirname(request), "result.jsonl")
with open(result, "w") as handle:
    handle.write('{"format": "peakmem-capture-result", "version": 1, "pid": 1, "result": {"steps": "many"}}\n')
os.kill(os.getpid(), signal.SIGKILL)
