# a local module named torch: `python train.py` imports this, not PyTorch
print("not PyTorch")
