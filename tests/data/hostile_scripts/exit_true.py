# sys.exit(True) is status 1
import sys

sys.exit(True)
