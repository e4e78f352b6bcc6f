"""The agents of several restored trees in one process: a restart of
many trees on one host (cli/restarting.py).

Why: an agent forked per tree cost its tree ~10 ms of CPU in the kernel
alone (the fork's page tables, then ~2050 copy-on-write faults as the
child touched the interpreter's objects, 8 MiB a child), on top of its
own work, and a restart of many trees on a small host is CPU-bound: 32
idle Python trees took ~30 ms of CPU each in the restart's processes
(bench_trees.py), CRIU's restore ~10.

Each agent is the one it would be in a process of its own (runner.Agent,
in a task of one loop), with these differences, all of them here or in
what they name:
- its tree knows it shares the process (agent/tree.py: which children
  are its own, which CRIU processes it may kill);
- the signals reach every agent (agent/signals.py);
- its records go to its own log file (logs.own_file, a context variable
  its tasks inherit, and so do the executor's threads here);
- the executor has threads for every agent's blocking work at once (a
  dump holds one for as long as CRIU runs: with asyncio's default of
  cores + 4, the dumps of many trees took turns while every tree was
  stopped).

Only trees that each run in a PID namespace of their own share a
process (config.agents_can_share).  dmtcp-restart may have begun their
restores already (cli/restarting.py), each claimed under a running
coordinator."""
from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from dmtcp_py import logs
from dmtcp_py.agent.config import AgentConfig
from dmtcp_py.agent.restoring import Restore
from dmtcp_py.agent.runner import Agent, restart_log_name
from dmtcp_py.errors import UserError, say

log = logging.getLogger("agent")

THREADS_PER_TREE = 4  # an agent's blocking jobs at once, at most (CRIU, files, seal, flush)


class _ContextExecutor(ThreadPoolExecutor):
    """Each job runs in the context of whoever submitted it (as
    asyncio.to_thread does; run_in_executor does not): an agent's records
    from its threads go to its own log."""

    def submit(self, fn, /, *args, **kwargs):
        return super().submit(contextvars.copy_context().run, fn, *args, **kwargs)


def run(configs: list[AgentConfig], begun: list[Restore] | None = None,
        claim_ends: list[Callable[[], None]] | None = None) -> list[int]:
    """Every tree's agent until each has ended: what each one's run()
    returned (1 for one that failed), in the order given.  begun: each
    tree's restore, if dmtcp-restart began them; claim_ends: what ends
    each tree's claim, if it made them."""
    logs.setup(restart_log_name(configs[0]))  # (and what no agent's context logs)
    return asyncio.run(_all(configs, begun or [None] * len(configs),
                            claim_ends or [None] * len(configs)))


async def _all(configs: list[AgentConfig], begun: list, claim_ends: list) -> list[int]:
    asyncio.get_running_loop().set_default_executor(
        _ContextExecutor(max_workers=THREADS_PER_TREE * len(configs) + 4,
                         thread_name_prefix="agent"))
    return list(await asyncio.gather(*(_one(cfg, k > 0, begun[k], claim_ends[k])
                                       for k, cfg in enumerate(configs))))


async def _one(cfg: AgentConfig, own_log: bool, begun: Restore | None,
               claim_ends: Callable[[], None] | None) -> int:
    if own_log:
        logs.own_file(restart_log_name(cfg))
    agent = Agent(cfg, begun=begun, shared=True, claim_ends=claim_ends)
    try:
        return await agent.run()
    except UserError as exc:
        agent.let_go()
        say(f"dmtcp-restart: error: {exc}")
        return 1
    except Exception:  # (a failure of ours: the other trees' agents go on)
        log.exception("the agent of %s failed", cfg.tree_id)
        agent.let_go()
        say(f"dmtcp-restart: error: the agent of {cfg.image} failed (see {logs.current()})")
        return 1
