"""Per-user room for actions in flight: the one rule every store's claim applies.

A store counts each owner's in-flight actions (claimed, submitted or running)
from its own data, inside its claim, so the cap holds across every node that
shares the store; this module only decides, candidate by candidate, who still
has room.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(slots=True)
class InFlightRoom:
    """Caps and current in-flight counts per owner; `take` uses up room."""

    #: Per-user overrides (`UserLimits.max_in_flight_actions`).
    caps: Mapping[str, int]
    #: The server-wide cap for everyone else; None means no cap.
    default: int | None
    in_flight: Counter[str] = field(default_factory=Counter)

    @property
    def capped(self) -> bool:
        """Whether any owner has a cap at all (else claims skip the counting)."""
        return self.default is not None or bool(self.caps)

    def cap(self, owner: str) -> int | None:
        return self.caps.get(owner, self.default)

    def take(self, owner: str) -> bool:
        """Count one more action of `owner` in flight if they have room; else False."""
        cap = self.cap(owner)
        if cap is not None and self.in_flight[owner] >= cap:
            return False
        self.in_flight[owner] += 1
        return True

    def full(self) -> list[str]:
        """Owners with no room left (their READY actions are not candidates)."""
        full = []
        for owner, count in self.in_flight.items():
            cap = self.cap(owner)
            if cap is not None and count >= cap:
                full.append(owner)
        return sorted(full)
