"""Live microphone transcription: the same as `streamd listen` (see `--help`)."""
import sys

from streamd.cli import main

if __name__ == "__main__":
    sys.exit(main(["listen", *sys.argv[1:]]))
