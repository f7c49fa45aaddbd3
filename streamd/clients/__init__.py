"""Clients of the streaming protocol v1 (``docs/protocol.md``): microphone and files.

They talk to a daemon only through the documented websocket protocol and never import torch
(nor anything that does), so they run on machines without the model's dependencies.
"""
