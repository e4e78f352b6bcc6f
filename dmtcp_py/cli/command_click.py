"""dmtcp-command's options as click reads them: every command line but
the usual -s, -l, -c, -bc, -kc, -k and -q (command.py reads those without
click)."""
from __future__ import annotations

import json
import sys

import click

from dmtcp_py import __version__, graph_view
from dmtcp_py.cli.actions import summary
from dmtcp_py.cli.base import AUTO, CONTEXT, INTERVAL, coord_host_option, coord_port_option
from dmtcp_py.cli.status import _print_status
from dmtcp_py.client import CoordinatorClient
from dmtcp_py.errors import UserError
from dmtcp_py.protocol.messages import Cmd, Progress, Reply


@click.command(context_settings=CONTEXT)
@coord_host_option
@coord_port_option
@click.option("-s", "--status", "action", flag_value="status", help="Print the status.")
@click.option("-l", "--list", "action", flag_value="list", help="List trees and processes.")
@click.option("--graph", "action", flag_value="graph",
              help="Show who talks to whom: bytes per second between trees, by host, and the "
                   "groups of frequent communicators (with --json, --dot or --png FILE).")
@click.option("--dot", "as_dot", is_flag=True, help="--graph as Graphviz DOT.")
@click.option("--png", "png_file", metavar="FILE", help="--graph drawn into FILE (Graphviz).")
@click.option("-c", "--checkpoint", "action", flag_value="checkpoint",
              help="Request a checkpoint and return.")
@click.option("-bc", "--bcheckpoint", "action", flag_value="bcheckpoint",
              help="Checkpoint and return when every image is complete.")
@click.option("-kc", "--kcheckpoint", "action", flag_value="kcheckpoint",
              help="Checkpoint, stop the computation once its images are written, and return.")
@click.option("-k", "--kill", "action", flag_value="kill", help="Kill the computation.")
@click.option("-q", "--quit", "action", flag_value="quit",
              help="Kill the computation and the coordinator.")
@click.option("-i", "--interval", type=INTERVAL, default=None, metavar="SECONDS|auto",
              help="Set the checkpoint interval (0 disables; auto: the coordinator chooses "
                   "it from its checkpoints' cost and the failures it sees).")
@click.option("--migrate", "migrate", metavar="TREE[,TREE...]",
              help="Move these trees (tree ids from -l --json, or HOST:PID of a process in "
                   "each) to --to HOST, or to a fresh copy on their own host, while every "
                   "other tree keeps running; returns when they run again.")
@click.option("--vacate", "vacate", metavar="HOST",
              help="Move every tree off HOST (to --to HOST2, else to a fresh copy on HOST).")
@click.option("--to", "to", metavar="HOST", default="",
              help="Where --migrate or --vacate moves the trees.")
@click.option("--with-group", is_flag=True,
              help="--migrate: each tree with the trees it talks to most (see --graph).")
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable output (-s, -l, --graph, --migrate, --vacate).")
@click.version_option(__version__, "--version")
def cli(coord_host, coord_port, action, interval, as_json, as_dot, png_file,
        migrate, vacate, to, with_group):
    """Send one command to the coordinator at HOST:PORT."""
    if migrate is not None or vacate is not None:
        if action is not None or migrate is not None and vacate is not None:
            raise UserError("--migrate and --vacate go alone (with --to, --with-group, --json)")
        with CoordinatorClient(coord_host, coord_port, timeout=None) as client:
            if migrate is not None:
                trees = tuple(t for t in migrate.split(",") if t.strip())
                reply = client.command(Cmd.MIGRATE, trees=trees, to=to, with_group=with_group)
            else:
                reply = client.command(Cmd.VACATE, host=vacate, to=to)
        return _print_migration(reply, as_json)
    if to or with_group:
        raise UserError("--to and --with-group go with --migrate or --vacate")
    if (as_dot or png_file) and action is None:
        action = "graph"
    if (as_dot or png_file) and action != "graph":
        raise UserError("--dot and --png go with --graph")
    if action is None and interval is not None:
        action = "interval"
    if action is None:
        raise UserError("no command given: one of -s, -l, --graph, -c, -bc, -kc, -k, -q, "
                        "-i N|auto")
    blocking = action in ("bcheckpoint", "kcheckpoint")
    with CoordinatorClient(coord_host, coord_port, timeout=None if blocking else 30.0) as client:
        if action == "graph":
            return _print_graph(client.command(Cmd.GRAPH).body, as_json, as_dot, png_file)
        if action in ("status", "list"):
            reply = client.command(Cmd(action))
            return _print_status(reply.body, coord_host, coord_port, as_json,
                                 listing=action == "list")
        if action in ("checkpoint", "bcheckpoint", "kcheckpoint"):
            reply = _checkpoint(client, blocking=blocking, stop=action == "kcheckpoint")
        elif action == "interval":
            reply = (client.command(Cmd.INTERVAL, auto=True) if interval == AUTO
                     else client.command(Cmd.INTERVAL, seconds=interval))
        else:
            reply = client.command(Cmd(action))
    if not reply.ok:
        raise UserError(reply.error or f"{action} failed")
    body = reply.body
    if action != "interval":  # the same lines as the path without click (actions.py)
        line = summary(action, body)
        if line is not None:
            click.echo(line)
    elif interval == AUTO:
        if not body.get("interval_auto"):
            # an older coordinator ignores the word and took 0 seconds
            raise UserError("this coordinator does not know -i auto (an older version?)")
        click.echo(f"checkpoint interval: auto, {body['interval']:.1f} s for now")
    else:
        click.echo(f"checkpoint interval: {body['interval']:g} s")
    return 0


def _print_migration(reply: Reply, as_json: bool) -> int:
    if not reply.ok:
        raise UserError(f"migration failed: {reply.error}" if reply.body.get("kind") == "migrate"
                        else reply.error or "migration failed")
    body = reply.body
    if as_json:
        click.echo(json.dumps(body, indent=1, sort_keys=True))
        return 0
    click.echo(f"migrated {body['trees']} trees ({', '.join(body['moved'])}) to "
               f"{', '.join(body['to'])} in {body['duration']:.3f} s, {body['bytes']} bytes")
    return 0


def _print_graph(graph: dict, as_json: bool, as_dot: bool, png_file: str | None) -> int:
    if "edges" not in graph:  # an older coordinator answers with an error body
        raise UserError("this coordinator does not know --graph (an older version?)")
    if png_file:
        graph_view.png(graph, png_file)
        click.echo(f"wrote {png_file}")
    elif as_dot:
        click.echo(graph_view.dot(graph), nl=False)
    elif as_json:
        click.echo(json.dumps(graph, indent=1, sort_keys=True))
    else:
        click.echo("\n".join(graph_view.lines(graph)))
    return 0


def _checkpoint(client: CoordinatorClient, *, blocking: bool, stop: bool) -> Reply:
    """A blocking checkpoint on a terminal shows its progress there."""
    if not (blocking and sys.stderr.isatty()):
        return client.command(Cmd.CHECKPOINT, blocking=blocking, stop=stop)
    meter = ProgressLine(sys.stderr)
    try:
        return client.command_watching(Cmd.CHECKPOINT, meter.show, blocking=True, stop=stop)
    finally:
        meter.close()


class ProgressLine:
    """One line on a terminal, redrawn: image bytes written of the expected."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.shown = False

    def show(self, note: Progress) -> None:
        mib = 1 << 20
        written, expected = note.written, max(note.expected, 1)
        self.stream.write(f"\rcheckpoint {note.generation}: {written / mib:.1f} of "
                          f"{expected / mib:.1f} MiB written ({min(100, 100 * written // expected)}%)"
                          f", {note.reporting} of {note.trees} trees\x1b[K")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()


