"""The bridge's AINET agent id, generated once and kept stable across restarts.

The id lives in a small file on the local data folder (not in the shared workspace: a
second device syncing the workspace must not pick up this device's id). Two processes
starting at once agree on one id: the file is created exclusively and the loser reads
the winner's.
"""

from __future__ import annotations

from pathlib import Path

from adapters.ainet.fsio import create_exclusive, read_bounded
from adapters.ainet.names import AGENT_ID_MAX_BYTES, UnsafeNameError, check_agent_id, new_agent_id


def load_or_create_agent_id(path: Path, name: str, host: str | None = None) -> str:
    """The agent id stored in ``path``, creating ``Device-<host+4>/<name>`` there first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = read_bounded(path, AGENT_ID_MAX_BYTES + 2)
    if data is None:
        fresh = new_agent_id(name, host)
        create_exclusive(path, (fresh + "\n").encode())
        data = read_bounded(path, AGENT_ID_MAX_BYTES + 2)
        if data is None:
            raise UnsafeNameError(f"{path}: cannot read the agent id file back")
    try:
        return check_agent_id(data.decode("utf-8"))
    except (UnicodeDecodeError, UnsafeNameError) as exc:
        raise UnsafeNameError(f"{path} does not hold a valid agent id ({exc})") from None
