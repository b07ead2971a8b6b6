# asks for 2**62 bytes on the GPU: on a real GPU an OutOfMemoryError (the estimate should say
# it does not fit, or report the job's error), never a crash of peakmem
import sys

import torch

shape = {"2**62": (2**62,), "overflow": (2**40, 2**40), "neg": (-1,)}[sys.argv[1]]
x = torch.empty(*shape, dtype=torch.uint8, device="cuda")
