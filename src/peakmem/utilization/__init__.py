"""GPU utilization from the trace: per-op cost (FLOPs, bytes moved), GPU throughput profiles, a
timing model of one steady-state training iteration, and the DCGM-style metrics it predicts
(GRACT, SMACT, SMOCC, DRAMA, FP32A) with the iteration time. See docs/utilization.md."""
