"""dmtcp-image: an image between hosts, as one byte stream.

    ssh HOST1 dmtcp-image send DIR/ckpt_a_1.dmtcp | ssh HOST2 dmtcp-image receive DIR
    ssh HOST2 dmtcp-image has DIR/ckpt_a_1.dmtcp --generation 7
    ssh HOST1 dmtcp-image send --generation 7 DIR/ckpt_a_1.dmtcp | ...

What the restart script does when a tree moves to a host that does not
have its image (its own host is gone, and a replica is elsewhere).
`receive` checks every file against the digest its manifest recorded and
publishes the copy atomically (0600 files, 0700 directory); it prints the
image's path there.  Nothing in the stream is ever run.
"""
from __future__ import annotations

import sys
from pathlib import Path

import click

from dmtcp_py import __version__
from dmtcp_py.cli.base import CONTEXT, run
from dmtcp_py.errors import ImageError
from dmtcp_py.images import store, transfer


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, "--version")
def cli():
    """Send a checkpoint image to stdout, or receive one from stdin."""


@cli.command()
@click.argument("image", type=click.Path(file_okay=False, path_type=Path))
@click.option("--generation", type=click.IntRange(min=1),
              help="Send this generation of IMAGE (kept beside it once a newer one came).")
def send(image, generation):
    """Write IMAGE (a ckpt_*.dmtcp directory) to stdout."""
    if sys.stdout.isatty():
        raise click.UsageError("stdout is a terminal; pipe it into dmtcp-image receive")
    transfer.send(image, sys.stdout.buffer, generation=generation)
    return 0


@cli.command()
@click.argument("ckptdir", type=click.Path(file_okay=False, path_type=Path))
def receive(ckptdir):
    """Read an image from stdin into CKPTDIR; print its path."""
    click.echo(transfer.receive(sys.stdin.buffer, ckptdir))
    return 0


@cli.command()
@click.argument("image", type=click.Path(file_okay=False, path_type=Path))
@click.option("--generation", type=click.IntRange(min=1), required=True,
              help="The generation the image must hold.")
def has(image, generation):
    """Print where that generation of IMAGE is (IMAGE itself, or kept beside
    it once a newer one took the name) and exit 0 if it is complete; else 1."""
    try:
        found, _ = store.load_generation(image, generation)
    except ImageError:
        return 1
    click.echo(found)
    return 0


def main() -> None:
    sys.exit(run("dmtcp-image", cli))


if __name__ == "__main__":
    main()
