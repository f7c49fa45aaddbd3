"""What a stream does that is not I/O: its conversation (`core.StreamSession`), utterances and
endpointing. No sockets, tasks or threads: `server/handler.py` pumps it.

The words, as the code and `docs/protocol.md` use them:

- connection: one websocket (`server/handler.Connection`). It carries one stream, or, after a
  resume, the rest of a parked one.
- face: the protocol a connection speaks (`server/handler.Face`): native (`server/native.py`),
  OpenAI Realtime (`server/realtime.py`) or Deepgram live (`server/deepgram.py`).
- stream: what a client sends from `start` to `stop`, and the results it gets back; its
  conversation is a `StreamSession`.
- session: a stream as resume sees it, named by its session id (`server/resume.py`); it outlives
  a dropped connection. The Realtime and Deepgram faces call their stream a session too.
- segment: the part of a stream between two `finalize`s (a Realtime commit or clear). Each has
  its own engine stream, so the utterance a `finalize` closes holds all audio sent before it.
- utterance: the words between two endpoints of a segment: partials, then one final.
- engine stream: the engine's side of a segment (`engine.types.EngineSession`), numbered by an
  integer `id` in the process that opened it (`SegmentStream` in the handler pairs the two); on
  the engine thread its audio and counts are an `engine.stream.Stream`.
- slot: the row of the engine's batched model state an engine stream holds while it is open
  (`Stream.slot`); the engine's capacity is its number of slots.
"""
