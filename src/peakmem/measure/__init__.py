"""Ground truth on a real GPU: run a job for N optimizer steps and record its peak memory.

Device access sits behind :class:`peakmem.measure.probe.DeviceProbe` so that all logic is tested
on the CPU with :class:`peakmem.measure.fake_probe.FakeProbe`.
"""
