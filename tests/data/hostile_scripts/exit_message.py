# sys.exit("message"): python prints it and exits 1
import sys

sys.exit("the job gave up: no data")
