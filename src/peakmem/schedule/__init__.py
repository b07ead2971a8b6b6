"""Scheduling with the estimate: where jobs go (`pack`) and the request each scheduler takes
(`emit`). Reads estimate JSON objects (`peakmem estimate --json`); reaches back into nothing
but the profiles and, for jobs files, `peakmem.estimate.estimate_command`."""
