"""`python -m batching ...`: the command line (batching/cli/)."""
import sys

from batching.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
