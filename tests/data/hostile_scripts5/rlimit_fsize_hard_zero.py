# trains, then lowers its soft AND hard limit on file sizes to 0 (a hard limit cannot be raised
# again): a job that writes no file afterwards runs fine so under python
import resource

from _train import train

train()
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
