"""Who a live command is (:class:`Ticket`), and the label its session keeps so a later server adopts it."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal

from ..contract import ExecRequest
from ..contract.values import MAX_LABEL_BYTES

DOORS = ("websocket", "mcp")
#: the version of the label a live command's session keeps (Ticket.label)
LABEL_VERSION = 1
Door = Literal["websocket", "mcp"]


@dataclass(frozen=True)
class Ticket:
    """Who a live command is, fixed before it starts: what the registry lists, and the label a session that
    holds its commands keeps with it, so a later server (a restart, a second one) adopts it under the same id."""

    id: str
    session_id: str
    owner: str
    argv: tuple[str, ...]
    pty: bool
    door: Door
    started_at: float
    deadline: float

    def label(self) -> str:
        """The ticket as JSON, argv shortened to fit the label's bytes (it is only shown)."""
        record: dict[str, Any] = {
            "v": LABEL_VERSION,
            "exec": self.id,
            "session": self.session_id,
            "owner": self.owner,
            "pty": self.pty,
            "door": self.door,
            "started": self.started_at,
            "deadline": self.deadline,
            "argv": [],
        }
        room = MAX_LABEL_BYTES - len(json.dumps(record).encode())
        for arg in self.argv:
            room -= len(json.dumps(arg).encode()) + 2
            if room < 0:
                break
            record["argv"].append(arg)
        return json.dumps(record)

    def labelled(self, request: ExecRequest) -> ExecRequest:
        return dataclasses.replace(request, label=self.label())

    @classmethod
    def from_label(cls, label: str | None, session_id: str) -> Ticket | None:
        """The ticket a label holds; None for one that is not a live command's of this session."""
        try:
            record = json.loads(label or "")
            ticket = cls(
                id=record["exec"],
                session_id=record["session"],
                owner=record["owner"],
                argv=tuple(record["argv"]),
                pty=bool(record["pty"]),
                door=record["door"],
                started_at=float(record["started"]),
                deadline=float(record["deadline"]),
            )
        except (ValueError, TypeError, KeyError):
            return None
        valid = (
            record.get("v") == LABEL_VERSION
            and ticket.session_id == session_id
            and ticket.door in DOORS
            and isinstance(ticket.id, str)
            and ticket.id.startswith("exe-")
            and isinstance(ticket.owner, str)
            and all(isinstance(arg, str) for arg in ticket.argv)
        )
        return ticket if valid else None
