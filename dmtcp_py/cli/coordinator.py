"""dmtcp-coordinator: one per computation (coordinating.py).

The usual command lines are read without click (fastargs.py), the rest by
click (coordinator_click.py): a launch or a restart that starts its own
coordinator forks it, and click's import and parsing were a fifth of what
the coordinator took to listen.
"""
from __future__ import annotations

import sys

from dmtcp_py.cli import fastargs
from dmtcp_py.cli.no_tls import keep_ssl_out
from dmtcp_py.errors import one_line


def run_coordinator(words: list[str]) -> int:
    """The exit code of dmtcp-coordinator with these arguments."""
    args = fastargs.coordinator_args(words)
    if args is None:  # --help, --version, or something to complain about
        from dmtcp_py.cli.base import run
        from dmtcp_py.cli.coordinator_click import cli
        return run("dmtcp-coordinator", cli, words)
    from dmtcp_py.cli.coordinating import serve
    return one_line("dmtcp-coordinator", serve, args)


def main() -> None:
    keep_ssl_out()
    sys.exit(run_coordinator(sys.argv[1:]))


if __name__ == "__main__":
    main()
