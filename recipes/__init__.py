"""Data recipes for training streamd models."""
