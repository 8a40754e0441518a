"""``python -m backward_twice watch SCRIPT``: the ``backward-twice`` command, for an environment whose scripts folder
is not on ``PATH``."""

from backward_twice.cli import run

if __name__ == "__main__":
    run()
