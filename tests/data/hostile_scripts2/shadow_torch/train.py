from _train import train

train()
