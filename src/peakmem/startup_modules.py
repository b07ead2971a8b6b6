"""The modules this interpreter had loaded before peakmem's first import.

Imported first by `peakmem/__init__.py`. A job's child (capture/child.py) and the warm process
(jobs/zygote.py) start as `python -c` whose first import is peakmem, so this is what a plain
`python train.py` has loaded at its start too (the interpreter's, site's and .pth files'
modules), before the script's directory joins sys.path: a local file of one of these names
cannot shadow it. See `peakmem.capture.shadowing`.
"""

import sys

MODULES = frozenset(name for name in sys.modules if name != __name__)
