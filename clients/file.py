"""Transcribe audio files through a running daemon: the same as `streamd transcribe` (see `--help`)."""
import sys

from streamd.cli import main

if __name__ == "__main__":
    sys.exit(main(["transcribe", *sys.argv[1:]]))
