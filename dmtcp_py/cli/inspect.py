"""dmtcp-inspect: what checkpoint images hold."""
from __future__ import annotations

import json
import sys

import click

from dmtcp_py import __version__
from dmtcp_py.cli.base import CONTEXT, run
from dmtcp_py.images import inspect as inspect_mod


@click.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.version_option(__version__, "--version")
@click.argument("images", nargs=-1, required=True, metavar="IMAGE...")
def cli(as_json, images):
    """Show what each ckpt_*.dmtcp IMAGE holds: program, host, generation and
    time; processes and threads; sockets with their peers and the bytes in
    flight; open files; sizes.  Reads only."""
    infos = [inspect_mod.describe(image) for image in images]
    if as_json:
        click.echo(json.dumps(infos, indent=1, sort_keys=True))
    else:
        click.echo("\n\n".join("\n".join(inspect_mod.text(i)) for i in infos))
    return 0


def main() -> None:
    sys.exit(run("dmtcp-inspect", cli))


if __name__ == "__main__":
    main()
