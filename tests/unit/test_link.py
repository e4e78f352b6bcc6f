"""agent.link.CoordinatorLink: every message the coordinator sent is read
before the link's end, also when the end is a reset (a coordinator killed
with our last message unread)."""
from __future__ import annotations

import asyncio
import socket
import struct

from dmtcp_py.agent.link import CoordinatorLink
from dmtcp_py.protocol import messages


def test_messages_sent_before_a_reset_are_read_before_the_end():
    async def scenario() -> list:
        got: list = []
        joined, done = asyncio.Event(), asyncio.Event()

        async def coordinator(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(65536)  # the hello
            writer.write(messages.encode(messages.Welcome(comp_id="c", agent_id=1)))
            await joined.wait()
            writer.write(messages.encode(messages.GenerationDone(generation=1, ok=True)))
            await writer.drain()
            await done.wait()  # (the agent's heartbeat is in our buffer, unread)
            sock = writer.get_extra_info("socket")
            # a close with unread bytes resets the connection; linger 0 makes sure
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()

        server = await asyncio.start_server(coordinator, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        link = CoordinatorLink("127.0.0.1", port)
        hello = messages.Hello(role=messages.Role.AGENT, token="t", host="h", pid=1,
                               program="p", tree_id="tree-1")
        await link.join(hello)
        link.send(messages.Heartbeat())
        joined.set()
        await asyncio.sleep(0.05)  # the GenerationDone and the heartbeat cross
        done.set()
        await asyncio.sleep(0.05)  # the reset arrives before the agent reads
        async for msg in link:
            got.append(msg)
        link.close()
        server.close()
        await server.wait_closed()
        return got

    got = asyncio.run(scenario())
    assert got == [messages.GenerationDone(generation=1, ok=True)]
