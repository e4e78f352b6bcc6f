"""The coordinator's asyncio adapter over loopback: typed messages in and
out, one connection closed for a bad frame or message, agents counted in
and out by their connections."""
from __future__ import annotations

import asyncio
import json
import struct

from dmtcp_py.coordinator.machine import CoordinatorMachine, SendAgent
from dmtcp_py.coordinator.server import CoordinatorServer
from dmtcp_py.protocol import messages
from dmtcp_py.protocol.messages import (
    Barrier,
    Cmd,
    Command,
    Hello,
    Kill,
    Message,
    Peers,
    ProcInfo,
    Refused,
    Reply,
    Role,
    Welcome,
)
from dmtcp_py.protocol.states import State

TOKEN = "tok"
TIMEOUT = 5.0
_opened: list[Peer] = []  # this test's connections, closed at its end


class Peer:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._messages = messages.Reader()
        self._pending: list[Message] = []

    @classmethod
    async def open(cls, port: int) -> Peer:
        peer = cls(*await asyncio.open_connection("127.0.0.1", port))
        _opened.append(peer)
        return peer

    def send(self, message: Message) -> None:
        self.writer.write(messages.encode(message))

    async def recv(self) -> Message:
        while not self._pending:
            data = await asyncio.wait_for(self.reader.read(65536), TIMEOUT)
            assert data, "closed by the coordinator"
            self._pending += self._messages.feed(data)
        return self._pending.pop(0)

    async def closed(self) -> bool:
        """True once the coordinator closed: whatever came before is dropped."""
        try:
            while await asyncio.wait_for(self.reader.read(65536), TIMEOUT):
                pass
        except ConnectionResetError:
            pass
        return True

    def close(self) -> None:
        self.writer.close()


async def until(predicate) -> None:
    for _ in range(int(TIMEOUT / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


def run(scenario) -> None:
    async def main():
        machine = CoordinatorMachine("comp")
        server = CoordinatorServer(machine, TOKEN, host="127.0.0.1", port=0, ckptdir=None,
                                   quiet=True)
        port = await server.start()
        try:
            await scenario(server, port)
        finally:
            server._server.close()
            for conn in list(server._conns.values()):
                conn.close()
            for peer in _opened:
                peer.close()
                try:
                    await peer.writer.wait_closed()
                except OSError:
                    pass
            _opened.clear()
            await server._server.wait_closed()
            await asyncio.sleep(0.05)  # the coordinator's side of them closes too
    asyncio.run(main())


def test_an_agent_joins_reports_and_leaves_with_its_connection():
    async def scenario(server, port):
        agent = await Peer.open(port)
        agent.send(Hello(role=Role.AGENT, token=TOKEN, host="h", pid=7, program="p",
                         tree_id="t"))
        welcome = await agent.recv()
        assert isinstance(welcome, Welcome) and welcome.comp_id == "comp"
        agent.send(Peers(procs=(ProcInfo(pid=8, name="p", rank=1),)))
        await until(lambda: server.machine.status()["num_peers"] == 1)
        client = await Peer.open(port)
        client.send(Hello(role=Role.CLIENT, token=TOKEN))
        assert isinstance(await client.recv(), Welcome)
        client.send(Command(cmd=Cmd.LIST))
        reply = await client.recv()
        assert isinstance(reply, Reply) and reply.ok and reply.error is None
        assert reply.body["num_peers"] == 1 and reply.body["running"] is True
        assert reply.body["trees"][0]["procs"] == [[8, "p", 1]]
        agent.close()
        await until(lambda: not server.machine.agents)
        client.send(Command(cmd=Cmd.STATUS))
        reply = await client.recv()
        assert reply.body["num_peers"] == 0 and "trees" not in reply.body
        client.send(Command(cmd=Cmd.INTERVAL, seconds=5))
        assert (await client.recv()).body == {"interval": 5.0, "interval_auto": False}
        client.close()
    run(scenario)


def test_a_broadcast_is_encoded_once_and_reaches_every_agent():
    async def scenario(server, port):
        agents = []
        for i in range(3):
            agent = await Peer.open(port)
            agent.send(Hello(role=Role.AGENT, token=TOKEN, tree_id=f"t{i}"))
            assert isinstance(await agent.recv(), Welcome)
            agents.append(agent)
        encoded = []
        real = messages.encode
        messages.encode = lambda m: encoded.append(m) or real(m)
        try:
            actions = server.machine.request_checkpoint(None, 0.0)
            assert len({id(a.message) for a in actions if isinstance(a, SendAgent)}) == 1
            server.apply(actions)
        finally:
            messages.encode = real
        assert len(encoded) == 1
        for agent in agents:
            assert await agent.recv() == Barrier(state=State.SUSPENDED, generation=1,
                                                 num_trees=3)
        server.apply(server.machine.kill(None))
        for agent in agents:
            assert await agent.recv() == Kill()
            agent.close()
    run(scenario)


def _frame(raw: dict) -> bytes:
    body = json.dumps(raw).encode()
    return struct.pack(">I", len(body)) + body


def test_bad_peers_are_closed_one_connection_at_a_time():
    async def scenario(server, port):
        good = await Peer.open(port)
        good.send(Hello(role=Role.CLIENT, token=TOKEN))
        assert isinstance(await good.recv(), Welcome)
        cases = [
            b"\x00\x00\x00\x02[]",                                             # not an object
            _frame({"v": 1, "type": "command", "cmd": "kill"}),                  # before hello
            _frame({"v": 2, "type": "hello", "role": "client", "token": TOKEN}),  # version
            _frame({"v": 1, "type": "hello", "role": "admin", "token": TOKEN}),   # role
            messages.encode(Hello(role=Role.CLIENT, token=TOKEN))
            + _frame({"v": 1, "type": "command", "cmd": "interval", "seconds": 10 ** 400}),
            messages.encode(Hello(role=Role.AGENT, token=TOKEN))
            + _frame({"v": 1, "type": "peers", "procs": [[1, "a"]]}),
        ]
        for data in cases:
            bad = await Peer.open(port)
            bad.writer.write(data)
            assert await bad.closed(), data
        # a wrong token is told why
        stranger = await Peer.open(port)
        stranger.send(Hello(role=Role.CLIENT, token="wrong"))
        assert await stranger.recv() == Refused(error="wrong computation token")
        assert await stranger.closed()
        # a client that sends what is not a command
        odd = await Peer.open(port)
        odd.send(Hello(role=Role.CLIENT, token=TOKEN))
        assert isinstance(await odd.recv(), Welcome)
        odd.send(Peers())
        assert await odd.closed()
        assert not server.machine.agents
        good.send(Command(cmd=Cmd.STATUS))
        reply = await good.recv()
        assert reply.ok and reply.body["checkpoint_interval"] == 0.0
        good.close()
    run(scenario)


def test_a_launch_announced_in_a_hello_holds_checkpoints_until_its_connection_ends():
    async def scenario(server, port):
        launch = await Peer.open(port)
        launch.send(Hello(role=Role.CLIENT, token=TOKEN, launching="t-new"))
        assert isinstance(await launch.recv(), Welcome)
        await until(lambda: len(server.machine.launches) == 1)
        client = await Peer.open(port)
        client.send(Hello(role=Role.CLIENT, token=TOKEN))
        assert isinstance(await client.recv(), Welcome)
        client.send(Command(cmd=Cmd.CHECKPOINT, blocking=True))
        await until(lambda: server.machine._waiting)
        launch.close()  # the launch ended before its agent joined
        reply = await client.recv()
        assert isinstance(reply, Reply) and reply.error == "no processes to checkpoint"
        assert len(server.machine.launches) == 0
        client.close()
    run(scenario)
