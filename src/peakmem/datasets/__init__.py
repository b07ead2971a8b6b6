"""Public measurement sets: the common row shape, the dataset loaders and the GPUMemNet job rebuilders.

Below both `peakmem.baselines` (the estimators read rows and rebuild jobs) and `peakmem.bench`
(the harness scores estimators on rows): it imports neither of them.
"""
