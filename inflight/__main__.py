"""`python -m inflight serve | generate | bench`: the same command line as `inflight`."""

import sys

from inflight.cli import main

if __name__ == "__main__":
    main(sys.argv[1:])
