"""images.socket_table: the manifest's socket table rows, written and read
back; rows as images already on disk have them; corrupt rows refused with
an ImageError that names the row and the key."""
from __future__ import annotations

import copy
import json
import socket

import pytest

from dmtcp_py.agent import drain, fdtable
from dmtcp_py.agent.network import Network
from dmtcp_py.errors import ImageError
from dmtcp_py.images import socket_table
from dmtcp_py.images.socket_table import Connection, SocketInfo, SocketRow

OPTIONS = ((1, 2, "00000000"), (6, 1, "01000000"))


def info(**changes) -> SocketInfo:
    base = dict(ino=4242, family=int(socket.AF_INET), type=int(socket.SOCK_STREAM), proto=6,
                listening=False, local=("10.0.0.1", 40000), peer=("10.0.0.2", 5000),
                options=OPTIONS, key="tcp:10.0.0.1:40000", peer_key="tcp:10.0.0.2:5000")
    base.update(changes)
    return SocketInfo(**base)


ROWS = [
    # a connection under control, with bytes in flight
    SocketRow(info(), copies=((100, 3), (101, 3)), leader=True,
              connection=Connection("c1|c2", "b"), drained="socket-4242.drained.json",
              drained_bytes=17),
    # a listener
    SocketRow(info(ino=7, listening=True, local=("0.0.0.0", 5000), peer=None, peer_key=None),
              copies=((100, 4),)),
    # a connection leading out of the computation, not the leader's copy
    SocketRow(info(ino=8), copies=((102, 5),), leader=False, external=True),
    # a UDP socket with queued datagrams
    SocketRow(info(ino=9, type=int(socket.SOCK_DGRAM), proto=17, options=(),
                   key="udp:b/n/127.0.0.1:6000", peer=None, peer_key=None),
              copies=((100, 6),), peer_known=False, datagrams="socket-9.datagrams.json",
              datagram_count=3),
    # a Unix socket whose peer is outside the tree, abstract name; unbound
    SocketRow(info(ino=10, family=int(socket.AF_UNIX), type=int(socket.SOCK_SEQPACKET), proto=0,
                   local="@srv", peer=None, key="unix:boot:10", peer_key="unix:boot:11"),
              copies=((100, 7),), connection=Connection("u1|u2", "a")),
]


@pytest.mark.parametrize("row", ROWS, ids=["conn", "listener", "external", "udp", "unix"])
def test_round_trip(row):
    raw = row.to_json()
    # it is what the manifest holds: plain JSON
    assert json.loads(json.dumps(raw)) == raw
    assert SocketRow.from_json(raw) == row
    assert SocketRow.from_json(json.loads(json.dumps(raw))) == row


def test_encode_decode_table():
    assert socket_table.decode(socket_table.encode(ROWS)) == ROWS
    assert socket_table.decode([]) == []


# rows exactly as the code before the typed records wrote them into manifest.json
# (describe()'s dict, mutated, then copies/leader/conn/side/drained... added)
OLD_CONN = {"ino": 1234, "family": 2, "type": 1, "proto": 6, "listening": False,
            "local": ["127.0.0.1", 41234], "peer": ["127.0.0.1", 5000],
            "options": [[1, 2, "00000000"], [1, 9, "00000000"], [6, 1, "00000000"]],
            "key": "tcp:b/1/127.0.0.1:41234", "peer_key": "tcp:b/1/127.0.0.1:5000",
            "copies": [[300, 3]], "leader": True, "conn": "k1|k2", "side": "a",
            "drained": "socket-1234.drained.json", "drained_bytes": 5}
OLD_EXTERNAL = {"ino": 1235, "family": 10, "type": 1, "proto": 6, "listening": False,
                "local": ["::1", 41235], "peer": ["::1", 80], "options": [],
                "key": "tcp:b/1/::1:41235", "peer_key": "tcp:b/1/::1:80", "external": True,
                "copies": [[300, 4], [301, 4]], "leader": True}
OLD_UDP = {"ino": 1236, "family": 2, "type": 2, "proto": 17, "listening": False,
           "local": ["0.0.0.0", 6000], "peer": ["127.0.0.1", 6001], "options": [],
           "key": "udp:b/1/0.0.0.0:6000", "peer_key": "udp:b/1/127.0.0.1:6001",
           "peer_known": True, "copies": [[300, 5]], "leader": True,
           "datagrams": "socket-1236.datagrams.json", "datagram_count": 2}
OLD_UNIX = {"ino": 1237, "family": 1, "type": 1, "proto": 0, "listening": True,
            "local": "/tmp/srv.sock", "peer": None, "options": [], "key": "unix:b:1237",
            "peer_key": None, "copies": [[300, 6]], "leader": False}


@pytest.mark.parametrize("old", [OLD_CONN, OLD_EXTERNAL, OLD_UDP, OLD_UNIX],
                         ids=["conn", "external", "udp", "unix"])
def test_old_rows_read_and_written_back_the_same(old):
    row = SocketRow.from_json(copy.deepcopy(old))
    assert row.to_json() == old


def test_old_row_fields():
    row = SocketRow.from_json(OLD_CONN)
    assert row.info.local == ("127.0.0.1", 41234) and row.info.options[2] == (6, 1, "00000000")
    assert row.connection == Connection("k1|k2", "a") and row.drained_bytes == 5
    assert not row.info.is_udp and SocketRow.from_json(OLD_UDP).info.is_udp
    assert SocketRow.from_json(OLD_UDP).peer_known is True
    assert SocketRow.from_json(OLD_EXTERNAL).external is True
    unix = SocketRow.from_json(OLD_UNIX)
    assert unix.info.local == "/tmp/srv.sock" and unix.leader is False and unix.connection is None


def test_older_rows_without_optional_keys():
    """What the restart and dmtcp-inspect always read with defaults."""
    raw = {k: v for k, v in OLD_CONN.items()
           if k not in ("leader", "listening", "local", "peer", "peer_key", "options")}
    row = SocketRow.from_json(raw)
    assert row.leader is True and row.info.listening is False
    assert row.info.local is None and row.info.peer is None and row.info.options == ()


def test_unknown_keys_are_ignored():
    assert SocketRow.from_json({**OLD_UNIX, "newer": [1, 2]}) == SocketRow.from_json(OLD_UNIX)


def _with(**changes):
    raw = copy.deepcopy(OLD_CONN)
    for k, v in changes.items():
        if v is _DROP:
            del raw[k]
        else:
            raw[k] = v
    return raw


_DROP = object()


@pytest.mark.parametrize("raw, key", [
    (_with(ino="1234"), "ino"),
    (_with(ino=-1), "ino"),
    (_with(ino=_DROP), "ino"),
    (_with(family=True), "family"),
    (_with(type=1.0), "type"),
    (_with(proto=None), "proto"),
    (_with(listening="no"), "listening"),
    (_with(local=["127.0.0.1"]), "local"),
    (_with(local=["127.0.0.1", "80"]), "local"),
    (_with(peer=["127.0.0.1", 70000]), "peer"),
    (_with(peer=7), "peer"),
    (_with(options=[[1, 2]]), "options"),
    (_with(options=[[1, 2, "zz"]]), "options"),
    (_with(options="none"), "options"),
    (_with(key=_DROP), "key"),
    (_with(key=5), "key"),
    (_with(peer_key=["x"]), "peer_key"),
    (_with(copies=_DROP), "copies"),
    (_with(copies=[[300]]), "copies"),
    (_with(copies=[["300", 3]]), "copies"),
    (_with(copies={"300": 3}), "copies"),
    (_with(leader=1), "leader"),
    (_with(conn=3), "conn"),
    (_with(side=_DROP), "side"),
    (_with(side="c"), "side"),
    (_with(drained="../../etc/passwd"), "drained"),
    (_with(drained_bytes=-5), "drained_bytes"),
    (_with(drained_bytes="5"), "drained_bytes"),
    (_with(external="yes"), "external"),
    (_with(peer_known=0), "peer_known"),
    (_with(datagrams="a/b", datagram_count=1), "datagrams"),
])
def test_corrupt_row(raw, key):
    with pytest.raises(ImageError) as err:
        socket_table.decode([OLD_UNIX, raw], "/img/manifest.json")
    message = str(err.value)
    assert message.startswith("/img/manifest.json: socket table row 1 is corrupt:"), message
    assert repr(key) in message, message


@pytest.mark.parametrize("table", [[3], ["row"], [None]])
def test_row_that_is_no_object(table):
    with pytest.raises(ImageError, match="socket table row 0 is corrupt: not an object"):
        socket_table.decode(table)


def test_table_that_is_no_list():
    with pytest.raises(ImageError, match="socket table is corrupt"):
        socket_table.decode({"ino": 1})


def test_from_json_alone_names_the_row():
    with pytest.raises(ImageError, match=r"^socket table row is corrupt: 'side'"):
        SocketRow.from_json(_with(side="x"))


def test_info_is_frozen():
    with pytest.raises(AttributeError):
        ROWS[0].info.peer_key = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        ROWS[0].external = True  # type: ignore[misc]


# ---- built from live sockets ----------------------------------------------------------

@pytest.fixture
def tcp_pair():
    listener = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(listener.getsockname())
    b, _ = listener.accept()
    yield listener, a, b
    for s in (listener, a, b):
        s.close()


def test_describe_builds_the_info(tcp_pair):
    listener, a, b = tcp_pair
    ino = 99
    i = fdtable.describe(a, ino, 0)
    assert isinstance(i, SocketInfo)
    assert (i.ino, i.family, i.type, i.listening) == (ino, socket.AF_INET, socket.SOCK_STREAM,
                                                      False)
    assert i.local == a.getsockname() and i.peer == a.getpeername()
    assert i.key.startswith("tcp:") and i.peer_key == fdtable.describe(b, 1, 0).key
    assert fdtable.describe(listener, 2, 0).listening
    row = SocketRow(i, copies=((1, 3),))
    assert SocketRow.from_json(json.loads(json.dumps(row.to_json()))) == row


def test_network_table_rows(tcp_pair, tmp_path):
    """Network.table: the description, the connection, the drained file."""
    listener, a, b = tcp_pair
    net = Network(shims=None, send=lambda msg: None)  # type: ignore[arg-type]
    ia, il = fdtable.describe(a, 11, 0), fdtable.describe(listener, 12, 0)
    net.entries = {11: fdtable.SocketEntry(11, a, ia, [(500, 3)], True),
                   12: fdtable.SocketEntry(12, listener, il, [(500, 4)], True)}
    net.conns[11] = Connection("x|y", "a")
    net.drained[11] = drain.Drained(kind=drain.STREAM, data=b"hello")
    table = net.table(tmp_path)
    assert json.loads(json.dumps(table)) == table
    rows = {r.info.ino: r for r in socket_table.decode(table)}
    assert rows[11].info == ia and rows[12].info == il
    assert rows[11].connection == Connection("x|y", "a") and rows[12].connection is None
    assert rows[11].drained == "socket-11.drained.json" and rows[11].drained_bytes == 5
    saved = drain.Drained.from_json(json.loads((tmp_path / rows[11].drained).read_text()))
    assert saved.data == b"hello"
    assert "drained" not in table[1] and "external" not in table[1]
    net.entries = {}  # the sockets are the fixture's to close
