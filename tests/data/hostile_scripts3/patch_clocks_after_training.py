# trains, then stubs the clocks (a job's own timer stub; harmless under python once the job is
# done): the capture's duration must not be read from them (it was NaN: bad_result)
import time

from _train import train

train()
time.time = time.monotonic = time.perf_counter = lambda: float("nan")
time.monotonic_ns = time.perf_counter_ns = time.time_ns = lambda: -1
