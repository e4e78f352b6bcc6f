"""dmtcp-restart's options as click reads them: --help, --version, and
every command line the fast reader (fastargs.py) leaves to click, with
click's messages for what is wrong in it."""
from __future__ import annotations

import click

from dmtcp_py import __version__
from dmtcp_py.cli.base import CONTEXT, coord_host_option, coord_port_option, keep_option
from dmtcp_py.cli.common import coordinator_choice_options, tree_options
from dmtcp_py.cli.fastargs import RestartArgs
from dmtcp_py.cli.restart_flow import run_restart


@click.command(context_settings=CONTEXT)
@coord_host_option
@coord_port_option
@coordinator_choice_options
@click.option("--ckptdir", metavar="DIR",
              help="Where the next checkpoints go [default: next to each image].")
@tree_options(restart=True)
@keep_option
@click.option("--any-owner", is_flag=True,
              help="Restart images that another user owns (refused otherwise).")
@click.option("--allow-changed-files", is_flag=True,
              help="Restart even if a file the program maps read-only changed since the "
              "checkpoint (refused otherwise); the agent's log names each such file.")
@click.option("--lazy", is_flag=True,
              help="Run the program as soon as its processes are back; their memory comes in "
                   "as it is touched and in the background (CRIU's lazy pages).  The pages "
                   "are checked meanwhile: a damaged one kills the program.")
@click.version_option(__version__, "--version")
@click.option("--generation", type=click.IntRange(min=1), metavar="N",
              help="Restart generation N of each IMAGE: the image itself, or the one kept "
                   "beside it (IMAGE.gen-N) once a newer generation took its name.")
@click.argument("images", nargs=-1, required=True, metavar="IMAGE...")
def cli(coord_host, coord_port, join, new_coordinator, ckptdir, gzip, incremental, precopy,
        keep, any_owner, allow_changed_files, lazy, generation, images):
    """Restart the trees in the ckpt_*.dmtcp IMAGEs of one computation."""
    return run_restart(RestartArgs(host=coord_host, port=coord_port, join=join,
                               new_coordinator=new_coordinator, ckptdir=ckptdir, gzip=gzip,
                               incremental=incremental, keep=keep, any_owner=any_owner,
                               allow_changed_files=allow_changed_files, lazy=lazy,
                               generation=generation, images=list(images), precopy=precopy))
