"""``python -m backward_twice watch SCRIPT``: the ``backward-twice`` command, for an environment whose scripts folder
is not on ``PATH``."""

import sys

from backward_twice.cli import main

if __name__ == "__main__":
    sys.exit(main())
