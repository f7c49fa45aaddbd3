"""Runnable client scripts: `python -m clients.mic` and `python -m clients.file` from the repository root.

They are thin wrappers around `streamd listen` and `streamd transcribe`, whose implementations
live in :mod:`streamd.clients` so that they also ship with the installed package.
"""
