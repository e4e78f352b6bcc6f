"""What the commands that run programs share: the coordinator choice and
--gzip, --incremental and --precopy options.  (The options and one-line errors of every command are in
base.py; which coordinator they use, coordinators.py.)"""
from __future__ import annotations

import click


def coordinator_choice_options(f):
    """-j/--join and --new-coordinator, for the commands that may start one."""
    f = click.option("--new-coordinator", is_flag=True,
                     help="Start a new coordinator on the port; fail if one is there.")(f)
    return click.option("-j", "--join", is_flag=True,
                        help="Join an existing coordinator; never start one.")(f)


def gzip_option(f):
    return click.option("--gzip/--no-gzip", envvar="DMTCP_GZIP", default=False,
                        help="Compress the memory pages of this tree's images (zstd, on every "
                        "core, after the program runs again) [env DMTCP_GZIP=1; default: no].")(f)


def incremental_option(f):
    return click.option("--incremental/--no-incremental", envvar="DMTCP_INCREMENTAL",
                        default=False,
                        help="Write only the memory that changed since the previous generation "
                        "(1 MiB chunks, the rest shared with it by hard links); a restart from "
                        "such a generation first puts its page files together [env "
                        "DMTCP_INCREMENTAL=1; default: no].")(f)


def precopy_option(f):
    return click.option("--precopy/--no-precopy", envvar="DMTCP_PRECOPY", default=False,
                        help="Write most of each checkpoint's memory while the program runs "
                        "(CRIU's pre-dump): the program is stopped only to dump what it wrote "
                        "meanwhile; the checkpoint as a whole takes longer.  Implies "
                        "--incremental [env DMTCP_PRECOPY=1; default: no].")(f)
