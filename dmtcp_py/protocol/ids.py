"""Names that the agent and the coordinator both build and must build
alike (DESIGN.md section 7: what they share lives in protocol/)."""
from __future__ import annotations


def endpoint_id(local: str, peer: str) -> str:
    """How the coordinator's "matched" answer names one endpoint an agent
    reported: its own key and its peer's."""
    return f"{local}>{peer}"
