"""dmtcp-restart: bring checkpointed trees back (restarting.py).

The usual command lines are read without click (fastargs.py: its import
and parsing cost ~25 ms before the restore could begin), the rest by
click (restart_click.py); both run restart_flow.run_restart.
"""
from __future__ import annotations

import sys

from dmtcp_py.cli import fastargs
from dmtcp_py.cli.restart_flow import run_restart
from dmtcp_py.errors import one_line


def main() -> None:
    args = fastargs.restart_args(sys.argv[1:])
    if args is None:  # --help, --version, or something to complain about
        from dmtcp_py.cli.base import run
        from dmtcp_py.cli.restart_click import cli
        sys.exit(run("dmtcp-restart", cli))
    sys.exit(one_line("dmtcp-restart", run_restart, args))


if __name__ == "__main__":
    main()
