# trains, then removes every peakmem module from sys.modules (or blocks each: None), as a job
# that "cleans up" its imports might: harmless under python
import sys

from _train import train

train()
for name in [name for name in sys.modules if name == "peakmem" or name.startswith("peakmem.")]:
    if sys.argv[1] == "delete":  # (a second copy of each was imported: worked before)
        del sys.modules[name]
    else:
        sys.modules[name] = None
