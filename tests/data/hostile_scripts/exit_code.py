# sys.exit(int(argv[1])): 0 is success, any other int (256 and -1 included) is a failure
import sys

sys.exit(int(sys.argv[1]))
