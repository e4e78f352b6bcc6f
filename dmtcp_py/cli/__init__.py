"""The user-facing commands (click)."""
