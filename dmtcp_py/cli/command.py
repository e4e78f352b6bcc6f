"""dmtcp-command: talk to a running coordinator.

`-s` and `-l` are read and answered without click (fastargs.py,
status.py); every other command line goes to click (command_click.py).
"""
from __future__ import annotations

import os
import sys

from dmtcp_py.cli import fastargs
from dmtcp_py.cli.status import status
from dmtcp_py.errors import one_line


def main() -> None:
    args = fastargs.status_args(sys.argv[1:])
    if args is None:
        from dmtcp_py.cli.base import run
        from dmtcp_py.cli.command_click import cli
        sys.exit(run("dmtcp-command", cli))
    code = one_line("dmtcp-command", status, args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
