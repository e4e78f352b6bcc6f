"""dmtcp_py: transparent, DMTCP-style checkpoint/restart on top of CRIU."""

__version__ = "0.1.0"
