import threading, time
from _train import train
train()
threading.Thread(target=time.sleep, args=(3600,)).start()
