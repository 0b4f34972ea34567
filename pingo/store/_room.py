"""Per-user room for actions in flight: the rules every store's claim applies.

A store counts each owner's in-flight actions (claimed, submitted or running)
from its own data, inside its claim, so the cap holds across every node that
shares the store; this module only decides, candidate by candidate, who still
has room, and (`idle_first`) who goes first: an owner with nothing in flight gets
their oldest claimable action ahead of everyone's backlog, so one user's thousands
of READY actions never keep another user's one waiting until they are all done.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pingo.store.protocol import within_quotas

C = TypeVar("C")


@dataclass(slots=True)
class InFlightRoom:
    """Caps and current in-flight counts per owner; `take` uses up room."""

    #: Per-user overrides (`UserLimits.max_in_flight_actions`).
    caps: Mapping[str, int]
    #: The server-wide cap for everyone else; None means no cap.
    default: int | None
    #: Each owner's actions in flight as the store counted them.
    in_flight: Counter[str] = field(default_factory=Counter)
    #: What this claim took on top (`take`).
    taken: Counter[str] = field(default_factory=Counter)

    @property
    def capped(self) -> bool:
        """Whether any owner has a cap at all (else claims skip the counting)."""
        return self.default is not None or bool(self.caps)

    def cap(self, owner: str) -> int | None:
        return self.caps.get(owner, self.default)

    def take(self, owner: str) -> bool:
        """Count one more action of `owner` in flight if they have room; else False."""
        cap = self.cap(owner)
        if cap is not None and self.in_flight[owner] + self.taken[owner] >= cap:
            return False
        self.taken[owner] += 1
        return True

    def full(self) -> list[str]:
        """Owners with no room left (their READY actions are not candidates)."""
        full = []
        for owner, count in (self.in_flight + self.taken).items():
            cap = self.cap(owner)
            if cap is not None and count >= cap:
                full.append(owner)
        return sorted(full)

    def idle(self, owners: Iterable[str]) -> list[str]:
        """Those of `owners` with nothing in flight when the store counted, sorted
        (whatever this claim took for them since)."""
        return sorted({o for o in owners if self.in_flight[o] == 0})


def idle_first(
    room: InFlightRoom,
    oldest: Iterable[C],
    extra: Iterable[C],
    limit: int,
    quotas: Mapping[str, int] | None,
    *,
    owner_of: Callable[[C], str],
    age: Callable[[C], Any],
    type_of: Callable[[C], str],
    key: Callable[[C], Hashable],
) -> list[C]:
    """A claim's choice with idle owners served first, within `limit` and `quotas`.

    `oldest` holds the claim's candidates in age order, as chosen within the owners'
    room; `extra` the oldest claimable READY action of each owner with nothing in
    flight who has none among them. Each idle owner's oldest goes first, oldest first,
    then the rest in age order; each candidate once.
    """
    ordered = list(oldest)
    firsts: dict[str, C] = {}
    for candidate in ordered:
        owner = owner_of(candidate)
        # "" is a candidate whose owner the store did not look up (a lease to take over).
        if owner and owner not in firsts and room.in_flight[owner] == 0:
            firsts[owner] = candidate
    merged: list[C] = []
    seen: set[Hashable] = set()
    for candidate in (*sorted([*firsts.values(), *extra], key=age), *ordered):
        if key(candidate) not in seen:
            seen.add(key(candidate))
            merged.append(candidate)
    if quotas is None:
        return merged[:limit]
    return within_quotas(merged, limit, quotas, type_of)
