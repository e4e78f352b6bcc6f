"""dmtcp-launch: run a program under checkpoint control (launcher.py).

The usual command lines are read without click (fastargs.py: its import
alone would cost a third of the start-up allowed), the rest by click
(launch_click.py).
"""
from __future__ import annotations

import os
import sys

from dmtcp_py.cli import fastargs
from dmtcp_py.cli.no_tls import keep_ssl_out
from dmtcp_py.cli.launcher import launch
from dmtcp_py.errors import one_line


def main() -> None:
    keep_ssl_out()
    args = fastargs.launch_args(sys.argv[1:])
    if args is None:  # --help, --version, or something to complain about
        from dmtcp_py.cli.base import run
        from dmtcp_py.cli.launch_click import cli
        code = run("dmtcp-launch", cli)
    else:
        code = one_line("dmtcp-launch", launch, args)
    # no interpreter shutdown: a program that ended before the agent loaded
    # leaves the loading thread behind, and a whole agent's objects are not
    # worth tearing down one by one
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
