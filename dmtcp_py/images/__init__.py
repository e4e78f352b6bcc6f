"""Checkpoint images: one directory per tree, with a manifest."""
