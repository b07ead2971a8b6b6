# trains, then forbids itself any file write and any new file descriptor (a job that writes
# nothing runs fine so under python): peakmem's own result must still be delivered
import resource

from _train import train

train()
resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
resource.setrlimit(resource.RLIMIT_NOFILE, (3, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
