"""dmtcp-command: talk to a running coordinator.

`-s` and `-l` (fastargs.py, status.py) and `-c`, `-bc`, `-kc`, `-k`, `-q`
(fastargs.py, actions.py) are read and answered without click; every other
command line goes to click (command_click.py).
"""
from __future__ import annotations

import os
import sys

from dmtcp_py.cli import fastargs
from dmtcp_py.cli.status import status
from dmtcp_py.errors import one_line


def main() -> None:
    words = sys.argv[1:]
    args = fastargs.status_args(words)
    if args is not None:
        _exit(one_line("dmtcp-command", status, args))
    action = fastargs.action_args(words)
    # a blocking checkpoint on a terminal shows its progress: click's path
    if action is not None and not (action.blocking and sys.stderr.isatty()):
        from dmtcp_py.cli import actions
        _exit(one_line("dmtcp-command", actions.run, action))
    from dmtcp_py.cli.base import run
    from dmtcp_py.cli.command_click import cli
    sys.exit(run("dmtcp-command", cli))


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
