# trains, then stops itself with SIGSTOP: nobody sends the SIGCONT it waits for (it runs in its
# own session, no terminal's job control resumes it); without --timeout peakmem waited for ever
import os
import signal

from _train import train

train(1)
os.kill(os.getpid(), signal.SIGSTOP)
