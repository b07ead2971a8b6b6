"""peakmem as a cluster service: the estimation API (`peakmem serve`), the Kubernetes admission
webhook and batch estimates on Ray (`peakmem batch`).

The flow stays one way: a request becomes a :class:`~peakmem.service.jobs.EstimateJob`, a worker
runs ``peakmem estimate --json`` on it in a child process, and the JSON it prints is the result.
"""
