# deletes its own script while running
import os

os.remove(__file__)
print("deleted", __file__)
