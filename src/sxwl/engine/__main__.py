import sys

from sxwl.engine.supervisor import main

sys.exit(main(sys.argv[1:]))
