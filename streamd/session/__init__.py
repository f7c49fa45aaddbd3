"""What a stream does that is not I/O: its conversation (`core.StreamSession`), utterances and
endpointing. No sockets, tasks or threads: `server/handler.py` pumps it."""
