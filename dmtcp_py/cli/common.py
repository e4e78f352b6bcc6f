"""What the commands that run programs share: the coordinator choice and
the tree's --gzip, --incremental and --precopy options.  (The options and
one-line errors of every command are in base.py; which coordinator they
use, coordinators.py.)"""
from __future__ import annotations

import click


def coordinator_choice_options(f):
    """-j/--join and --new-coordinator, for the commands that may start one."""
    f = click.option("--new-coordinator", is_flag=True,
                     help="Start a new coordinator on the port; fail if one is there.")(f)
    return click.option("-j", "--join", is_flag=True,
                        help="Join an existing coordinator; never start one.")(f)


def tree_options(*, restart: bool = False):
    """--gzip, --incremental and --precopy: how the tree's checkpoints are
    written.  At a restart, one not given (nor in the environment) is as
    the image's tree had it (its manifest's `options`): None here."""
    default = None if restart else False
    said = "as the image's tree had it" if restart else "no"

    def decorate(f):
        f = click.option(
            "--precopy/--no-precopy", envvar="DMTCP_PRECOPY", default=default,
            help="Write most of each checkpoint's memory while the program runs (CRIU's "
            "pre-dump): the program is stopped only to dump what it wrote meanwhile; the "
            f"checkpoint as a whole takes longer.  Implies --incremental [env DMTCP_PRECOPY=1; "
            f"default: {said}].")(f)
        f = click.option(
            "--incremental/--no-incremental", envvar="DMTCP_INCREMENTAL", default=default,
            help="Write only the memory that changed since the previous generation (1 MiB "
            "chunks, the rest shared with it by hard links) [env DMTCP_INCREMENTAL=1; "
            f"default: {said}].")(f)
        return click.option(
            "--gzip/--no-gzip", envvar="DMTCP_GZIP", default=default,
            help="Compress the memory pages of this tree's images (zstd, on every core, after "
            f"the program runs again) [env DMTCP_GZIP=1; default: {said}].")(f)
    return decorate
