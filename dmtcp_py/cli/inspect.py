"""dmtcp-inspect: what checkpoint images hold."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from dmtcp_py import __version__
from dmtcp_py.cli.base import CONTEXT, run
from dmtcp_py.coordinator import restart_script
from dmtcp_py.images import inspect as inspect_mod


@click.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.version_option(__version__, "--version")
@click.argument("images", nargs=-1, required=True, metavar="IMAGE...")
def cli(as_json, images):
    """Show what each ckpt_*.dmtcp IMAGE holds: program, host, generation and
    time; processes and threads; sockets with their peers and the bytes in
    flight; open files; sizes.  Reads only."""
    infos = [_with_copies(inspect_mod.describe(image)) for image in images]
    if as_json:
        click.echo(json.dumps(infos, indent=1, sort_keys=True))
    else:
        click.echo("\n\n".join("\n".join(inspect_mod.text(i)) for i in infos))
    return 0


def _with_copies(info: dict) -> dict:
    """Where the tree's image has copies (--replicas), as the restart script
    beside the image says (an image's name is its tree's, on every host)."""
    here = Path(info["image"]).resolve()
    try:
        known = restart_script.copies_in((here.parent / restart_script.LINK).read_text())
    except OSError:
        known = {}
    info["copies"] = [f"{h}:{p}" for key, where in known.items()
                      if Path(key).name == here.name for h, p in where]
    return info


def main() -> None:
    sys.exit(run("dmtcp-inspect", cli))


if __name__ == "__main__":
    main()
