# C-level style writes straight to file descriptors 1 and 2
import os

os.write(1, b"RAW-WRITE-TO-FD-1\n")
os.write(2, b"RAW-WRITE-TO-FD-2\n")
