"""dmtcp-coordinator's options as click reads them: --help, --version, and
every command line the fast reader (fastargs.py) leaves to click, with
click's messages for what is wrong in it."""
from __future__ import annotations

import click

from dmtcp_py import __version__
from dmtcp_py.cli.base import CONTEXT, INTERVAL, coord_port_option, keep_option
from dmtcp_py.cli.coordinating import serve
from dmtcp_py.cli.fastargs import CoordinatorArgs
from dmtcp_py.coordinator import rebalance as rebalancing, recovery


@click.command(context_settings=CONTEXT)
@coord_port_option
@click.option("--listen", "listen_host", default="127.0.0.1", show_default=True, metavar="ADDR",
              help="Address to listen on; give 0.0.0.0 for trees on other hosts.")
@click.option("--port-file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write the port actually used here (useful with --coord-port 0).")
@click.option("--ckptdir", type=click.Path(file_okay=False), envvar="DMTCP_CHECKPOINT_DIR",
              metavar="DIR", help="Directory for the restart script (and images, for trees "
                                  "that do not choose their own) [env DMTCP_CHECKPOINT_DIR].")
@click.option("-i", "--interval", type=INTERVAL, default=0,
              envvar="DMTCP_CHECKPOINT_INTERVAL", metavar="SECONDS|auto",
              help="Checkpoint every SECONDS (0: only on request); auto: choose the interval "
                   "from the checkpoints' cost and the failures seen "
                   "[env DMTCP_CHECKPOINT_INTERVAL].")
@click.option("--exit-on-last", is_flag=True, help="Exit when the last process exits.")
@click.option("--exit-after-ckpt", is_flag=True,
              help="Stop the computation after its next checkpoint, then exit.")
@click.option("--auto-restart", is_flag=True, envvar="DMTCP_AUTO_RESTART",
              help="When a tree is lost (its program killed by a signal, its agent or host "
                   "gone), stop the others and restart all from the newest complete "
                   "checkpoint [env DMTCP_AUTO_RESTART=1].")
@click.option("--max-restarts", type=click.IntRange(min=0), default=recovery.MAX_RESTARTS,
              show_default=True, envvar="DMTCP_MAX_RESTARTS", metavar="N",
              help="Give up after N restart attempts [env DMTCP_MAX_RESTARTS].")
@click.option("--hosts", metavar="H1,H2,...|@FILE", envvar="DMTCP_HOSTS",
              help="Hosts the computation may use; those without trees are spares for "
                   "the trees of a lost host (a file: one host per line) [env DMTCP_HOSTS].")
@click.option("--heartbeat", type=click.FloatRange(min=0), default=recovery.HEARTBEAT,
              show_default=True, envvar="DMTCP_HEARTBEAT", metavar="SECONDS",
              help="Seconds between heartbeats with the agents; 0: none "
                   "[env DMTCP_HEARTBEAT].")
@click.option("--heartbeat-timeout", type=click.FloatRange(min=0),
              default=recovery.HEARTBEAT_TIMEOUT, show_default=True,
              envvar="DMTCP_HEARTBEAT_TIMEOUT", metavar="SECONDS",
              help="An agent (or coordinator) silent this long is lost "
                   "[env DMTCP_HEARTBEAT_TIMEOUT].")
@click.option("--replicas", type=click.IntRange(min=0), default=0, show_default=True,
              envvar="DMTCP_REPLICAS", metavar="N",
              help="Copy each tree's published images to N other hosts of the computation, "
                   "so that a lost host's trees restart from a copy [env DMTCP_REPLICAS].")
@keep_option
@click.option("--rebalance", is_flag=True, envvar="DMTCP_REBALANCE",
              help="Move the trees a host slows down (its CPUs taken by processes not under "
                   "control) to the least loaded host of --hosts [env DMTCP_REBALANCE=1].")
@click.option("--rebalance-after", type=click.FloatRange(min=0, min_open=True),
              default=rebalancing.AFTER, show_default=True, envvar="DMTCP_REBALANCE_AFTER",
              metavar="SECONDS",
              help="With --rebalance: how long a host stays overloaded before its slowed "
                   "trees move [env DMTCP_REBALANCE_AFTER].")
@click.option("--daemon", is_flag=True, help="Run in the background (no console).")
@click.option("-q", "--quiet", is_flag=True, help="Print no progress messages.")
@click.version_option(__version__, "--version")
def cli(coord_port, listen_host, port_file, ckptdir, interval, exit_on_last, exit_after_ckpt,
        auto_restart, max_restarts, hosts, heartbeat, heartbeat_timeout, replicas, keep,
        rebalance, rebalance_after, daemon, quiet):
    """Coordinate checkpoints of every process tree launched against it.

    Console commands on standard input: c checkpoint, l list, s status,
    i N (or i auto) interval, k kill, q quit, h help.
    """
    return serve(CoordinatorArgs(
        port=coord_port, listen_host=listen_host, port_file=port_file, ckptdir=ckptdir,
        interval=interval, exit_on_last=exit_on_last, exit_after_ckpt=exit_after_ckpt,
        auto_restart=auto_restart, max_restarts=max_restarts, hosts=hosts,
        heartbeat=heartbeat, heartbeat_timeout=heartbeat_timeout, replicas=replicas,
        keep=keep, rebalance=rebalance, rebalance_after=rebalance_after, daemon=daemon,
        quiet=quiet))
