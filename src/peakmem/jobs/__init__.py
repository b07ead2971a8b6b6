"""Running a user's unmodified training script in-process: the script runner and the stop
mechanism (stop cleanly after N optimizer steps). Shared by `measure` and `estimate`."""
