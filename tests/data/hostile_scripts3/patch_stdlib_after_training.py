# trains, then rebinds the stdlib names a result writer would look up when the job is over
# (valid for a job that writes nothing afterwards: it runs fine under python); peakmem's own
# result must still be delivered
import builtins
import io
import json
import os
import sys

from _train import train

train()
json.dumps = lambda *args, **kwargs: '{"peak_bytes": 1}'
json.dump = lambda obj, handle, *args, **kwargs: handle.write('{"peak_bytes": 1}')
builtins.open = None
io.open = None
io.StringIO = None
os.replace = os.rename = lambda *args, **kwargs: None
os.getpid = lambda: 1
sys.modules["resource"] = None
