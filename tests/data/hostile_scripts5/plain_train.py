# trains and ends normally
from _train import train

train()
