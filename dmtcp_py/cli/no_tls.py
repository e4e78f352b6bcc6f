"""Our commands' processes never speak TLS, yet asyncio imports ssl (and
OpenSSL's bindings with it) as it loads, in case a caller asks for TLS:
~8 ms of CPU in every agent and coordinator, on the path of a launch and
of a restart until the program runs again.  keep_ssl_out() makes that
import fail, which asyncio takes as "this Python has no ssl".  Called
first thing by the commands that load asyncio, never by a library
import: a test or a script importing dmtcp_py keeps its ssl."""
from __future__ import annotations

import sys


def keep_ssl_out() -> None:
    sys.modules.setdefault("ssl", None)  # (import ssl: ImportError)
