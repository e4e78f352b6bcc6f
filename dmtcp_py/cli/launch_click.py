"""dmtcp-launch's options as click reads them: --help, --version, and
every command line the fast reader (fastargs.py) leaves to click, with
click's messages for what is wrong in it."""
from __future__ import annotations

import click

from dmtcp_py import __version__
from dmtcp_py.cli.base import (CONTEXT, INTERVAL, coord_host_option, coord_port_option,
                               keep_option)
from dmtcp_py.cli.common import coordinator_choice_options, tree_options
from dmtcp_py.cli.fastargs import LaunchArgs
from dmtcp_py.cli.launcher import launch


@click.command(context_settings={**CONTEXT, "allow_interspersed_args": False})
@coord_host_option
@coord_port_option
@coordinator_choice_options
@click.option("--ckptdir", metavar="DIR",
              help="Where this tree's images go [env DMTCP_CHECKPOINT_DIR; default: the "
                   "coordinator's --ckptdir, else cwd].")
@click.option("-i", "--interval", type=INTERVAL, default=None,
              envvar="DMTCP_CHECKPOINT_INTERVAL", metavar="SECONDS|auto",
              help="Checkpoint interval of a coordinator started here (auto: it chooses).")
@tree_options()
@keep_option
@click.version_option(__version__, "--version")
@click.argument("program")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def cli(coord_host, coord_port, join, new_coordinator, ckptdir, interval, gzip, incremental,
        precopy, keep, program, args):
    """Run PROGRAM with ARGS under checkpoint control.

    Starts a coordinator on this host when none answers (unless --join).
    Exits with PROGRAM's exit status.
    """
    return launch(LaunchArgs(host=coord_host, port=coord_port, join=join,
                             new_coordinator=new_coordinator, ckptdir=ckptdir,
                             interval=interval, gzip=gzip, program=program, args=list(args),
                             keep=keep, incremental=incremental, precopy=precopy))
