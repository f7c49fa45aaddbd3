"""What a stream does that is not I/O: endpointing and utterances (run on the event loop)."""
