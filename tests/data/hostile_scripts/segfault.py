# a segmentation fault in C code
import ctypes

ctypes.string_at(0)
