import sys

from streamd.cli import main

sys.exit(main())
