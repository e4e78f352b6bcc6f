"""What every command is made of, dmtcp-coordinator included: click's
settings, the coordinator address options, and run(), which turns every
failure into one line on stderr.

Apart from common.py (which starts coordinators, so it needs the
coordinator command) because the coordinator command needs these too.
"""
from __future__ import annotations

import click

from dmtcp_py.errors import UserError
from dmtcp_py.paths import DEFAULT_PORT

CONTEXT = {"help_option_names": ["--help"], "max_content_width": 100}


def coord_host_option(f):
    return click.option("-h", "--coord-host", envvar="DMTCP_COORD_HOST", default="127.0.0.1",
                        show_default=True, metavar="HOST",
                        help="Coordinator host [env DMTCP_COORD_HOST].")(f)


def coord_port_option(f, *, help_text="Coordinator port [env DMTCP_COORD_PORT]."):
    return click.option("-p", "--coord-port", envvar="DMTCP_COORD_PORT", default=DEFAULT_PORT,
                        show_default=True, type=click.IntRange(0, 65535), metavar="PORT",
                        help=help_text)(f)


AUTO = "auto"


class IntervalType(click.ParamType):
    """-i/--interval: seconds (0: off), or `auto` (the coordinator chooses
    them from its checkpoints' cost and the failures it sees).  The value is
    a float, or the string AUTO."""
    name = "interval"

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.strip().lower() == AUTO:
            return AUTO
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is neither a number of seconds nor 'auto'", param, ctx)
        if not (0 <= seconds < float("inf")):
            self.fail(f"{value!r}: seconds must be a finite number >= 0", param, ctx)
        return seconds


INTERVAL = IntervalType()


def run(name: str, command: click.Command, args: list[str] | None = None) -> int:
    """Run a click command; every failure is one line on stderr.  Returns
    the exit code."""
    try:
        code = command.main(args=args, prog_name=name, standalone_mode=False)
    except UserError as exc:
        click.echo(f"{name}: error: {exc}", err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        return 130
    except click.ClickException as exc:
        click.echo(f"{name}: error: {exc.format_message()} (see --help)", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return code if isinstance(code, int) else 0


def keep_option(f):
    return click.option("--keep", type=click.IntRange(min=0), envvar="DMTCP_KEEP", metavar="N",
                        help="Keep N previous generations of each image beside the newest "
                        "(ckpt_*.dmtcp.gen-G); older ones are deleted once a new one is "
                        "published [env DMTCP_KEEP; default: the coordinator's --keep, "
                        "else 1].")(f)
