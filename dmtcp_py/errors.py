"""Errors that reach the user as one line and a non-zero exit."""
from __future__ import annotations


class UserError(Exception):
    """Bad input or an unusable environment; the message is the whole story."""

    exit_code = 1


class CoordinatorUnreachable(UserError):
    exit_code = 2


class ImageError(UserError):
    """A missing, truncated or corrupt checkpoint image."""


def say(line: str) -> None:
    """line on stderr, in one write.  print() writes the text and its
    newline apart (stderr that is not a terminal writes through), and the
    agents of a many-tree restart share one stderr: two of them failing at
    once printed "...againdmtcp-restart: error: ..." on one line."""
    import sys
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def one_line(name: str, fn, *args) -> int:
    """fn(*args)'s exit code; a UserError is one line on stderr and its
    code.  (cli/base.py's run() does the same for a click command; this
    one needs no click, for the commands' fast paths.)"""
    import sys
    try:
        return fn(*args)
    except UserError as exc:
        say(f"{name}: error: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # (`... | head`): as click says it, 1 and no more
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
