"""The agent's signal handlers, shared by every agent of one process.

asyncio keeps one handler per signal and loop: a second
add_signal_handler replaces the first.  A restart that runs the agents of
several trees in one process (agent/together.py) needs each signal to
reach every one of them (SIGCHLD: each watches its own tree; SIGTERM:
each forwards it to its own root).  One process, one agent: the same as
add_signal_handler itself."""
from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable

# loop -> signal -> [(callback, args)], in the order they were added
_by_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Subscription:
    """One callback of one signal, until unsubscribe()."""

    def __init__(self, loop: asyncio.AbstractEventLoop, signum: int,
                 callback: Callable[..., object], args: tuple) -> None:
        self.loop, self.signum, self.callback, self.args = loop, signum, callback, args


def subscribe(signum: int, callback: Callable[..., object], *args) -> Subscription:
    """callback(*args) at every signum this process gets, beside the
    others subscribed to it, in the running loop."""
    loop = asyncio.get_running_loop()
    table = _by_loop.setdefault(loop, {})
    subs = table.setdefault(signum, [])
    if not subs:
        loop.add_signal_handler(signum, _deliver, table, signum)
    sub = Subscription(loop, signum, callback, args)
    subs.append(sub)
    return sub


def unsubscribe(sub: Subscription) -> None:
    """No more calls; the loop's handler goes with the signal's last one."""
    table = _by_loop.get(sub.loop, {})
    subs = table.get(sub.signum, [])
    if sub in subs:
        subs.remove(sub)
        if not subs:
            del table[sub.signum]
            sub.loop.remove_signal_handler(sub.signum)


def _deliver(table: dict, signum: int) -> None:
    for sub in list(table.get(signum, ())):
        sub.callback(*sub.args)
