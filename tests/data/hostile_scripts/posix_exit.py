# ends its process through posix._exit, around peakmem's os._exit hook: no result -> job_failed
import posix

print("bye")
posix._exit(0)
