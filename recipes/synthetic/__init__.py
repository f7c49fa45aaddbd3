"""Synthetic-speech training data: text, voices, synthesis, augmentation."""
