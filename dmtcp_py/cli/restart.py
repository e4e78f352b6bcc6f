"""dmtcp-restart: bring checkpointed trees back (restarting.py).

The usual command lines are read without click (fastargs.py: its import
and parsing cost ~25 ms before the restore could begin), the rest by
click (restart_click.py); both run restart_flow.run_restart.
"""
from __future__ import annotations

import gc
import sys

from dmtcp_py.cli import fastargs
from dmtcp_py.cli.no_tls import keep_ssl_out
from dmtcp_py.cli.restart_flow import run_restart
from dmtcp_py.errors import one_line


def main() -> None:
    # the cyclic collector's passes over what the imports make (all of it
    # lives as long as the process) cost ~10 ms before the program runs
    # again: off until restarting.restart freezes it
    gc.disable()
    keep_ssl_out()
    args = fastargs.restart_args(sys.argv[1:])
    if args is None:  # --help, --version, or something to complain about
        from dmtcp_py.cli.base import run
        from dmtcp_py.cli.restart_click import cli
        sys.exit(run("dmtcp-restart", cli))
    sys.exit(one_line("dmtcp-restart", run_restart, args))


if __name__ == "__main__":
    main()
