"""The coordinator: one per computation, drives the global barriers."""
