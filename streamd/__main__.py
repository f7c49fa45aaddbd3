import sys

from streamd.cli import main

if __name__ == "__main__":  # front-end processes are spawned: they import this module too
    sys.exit(main())
