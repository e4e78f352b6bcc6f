"""Errors that reach the user as one line and a non-zero exit."""
from __future__ import annotations


class UserError(Exception):
    """Bad input or an unusable environment; the message is the whole story."""

    exit_code = 1


class CoordinatorUnreachable(UserError):
    exit_code = 2


class ImageError(UserError):
    """A missing, truncated or corrupt checkpoint image."""
