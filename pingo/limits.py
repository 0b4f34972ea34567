"""Per-user limits: what applies to a user, the submission rate, the workflow cap and
the storage quota.

Four limits keep one user from taking the server (docs/limits.md):

- workflows RUNNING at once: counted in the store at each submission, so the cap
  holds across every node sharing it; beyond it a submission is refused (429);
- actions in flight (claimed, submitted or running): enforced by the store's
  claim, so extra work waits READY and nothing is refused (as in a YARN queue);
- submissions a minute: a token bucket per user, kept in this node's memory,
  so with N nodes a user may submit up to N times the rate;
- bytes of datasets on disk their workflows produced: summed in the store at each
  submission and (cached for a second) before each action starts; at or past the
  quota a submission is refused (403) and an action fails to start, until the user
  deletes datasets, since waiting would not help.

Beside them, `Slots` caps what a user holds open at once on this node (event
streams, verifications), so that one user cannot take threads or descriptors
the others need, and `SignInThrottle` the web UI's failed sign-ins per address.

Each limit is the user's own (`UserLimits`, set by an admin) or else the
server's default (`Settings.user_*`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pingo import errors, metrics
from pingo.config import Settings
from pingo.store.protocol import Store, UserLimits

logger = logging.getLogger(__name__)

#: The largest limit an admin may set (fits every store's integers).
MAX_LIMIT = 2**31 - 1
#: The largest storage quota an admin may set: 8 PiB, exact in every JSON reader's numbers.
MAX_BYTES_LIMIT = 2**53 - 1
#: Retry-After for a full workflow cap: a hint, since nobody knows when a workflow ends.
WORKFLOW_CAP_RETRY_S = 5


@dataclass(frozen=True, slots=True)
class EffectiveLimits:
    """The limits that apply to one user: theirs, else the server's (None: no limit)."""

    max_workflows: int | None
    max_in_flight_actions: int | None
    submissions_per_minute: int | None
    max_storage_bytes: int | None


def effective(own: UserLimits, settings: Settings) -> EffectiveLimits:
    """A user's own limits, each falling back to the server's default."""
    return EffectiveLimits(
        max_workflows=_either(own.max_workflows, settings.user_max_workflows),
        max_in_flight_actions=_either(
            own.max_in_flight_actions, settings.user_max_in_flight_actions
        ),
        submissions_per_minute=_either(
            own.submissions_per_minute, settings.user_submissions_per_minute
        ),
        max_storage_bytes=_either(own.max_storage_bytes, settings.user_max_storage_bytes),
    )


def _either(own: int | None, default: int | None) -> int | None:
    return default if own is None else own


def merge(current: UserLimits, changes: dict[str, int | None]) -> UserLimits:
    """`current` with `changes` applied (a None value resets that limit to the default)."""
    return dataclasses.replace(current, **changes)


async def check_workflow_cap(store: Store, owner: str, own: UserLimits, settings: Settings) -> None:
    """Refuse (429) a new workflow of `owner` when they have their cap RUNNING already.

    Counted from the store, so every node sharing it sees the same number. Two
    submissions at the same instant may both pass: the cap can be overshot by
    the user's concurrent submissions, which the rate limit bounds.
    """
    cap = effective(own, settings).max_workflows
    if cap is None:
        return
    running = await store.count_running_workflows(owner)
    if running >= cap:
        count_refusal(errors.TooManyWorkflows)
        raise errors.TooManyWorkflows(
            f"{owner} has {running} workflows running, the most allowed ({cap}); "
            "retry when one has finished",
            WORKFLOW_CAP_RETRY_S,
        )


async def check_storage_quota(
    store: Store, owner: str, own: UserLimits, settings: Settings
) -> None:
    """Refuse (403) a new workflow of `owner` when the datasets on disk their workflows
    produced hold their quota or more (`Store.bytes_produced_by`).

    A workflow admitted under the quota may go past it; then its next actions fail to
    start (`StorageQuotas`, before each spawn). A user gets back under it by deleting
    their datasets (`pingo datasets delete`), once the deletor has removed the files.
    """
    quota = effective(own, settings).max_storage_bytes
    if quota is None:
        return
    used = await store.bytes_produced_by(owner)
    if used >= quota:
        count_refusal(errors.StorageQuotaExceeded)
        logger.info(
            "refused a workflow of %s: %d bytes stored, quota %d",
            owner,
            used,
            quota,
            extra={"event": "storage_quota_exceeded", "owner": owner, "bytes": used},
        )
        raise errors.StorageQuotaExceeded(f"{_over_quota(owner, used, quota)} and submit again")


def _over_quota(owner: str, used: int, quota: int) -> str:
    """What a refusal by the storage quota says, at submission and before a spawn."""
    return (
        f"{owner}'s workflows produced {used} bytes of stored datasets, at or past their "
        f"quota of {quota} bytes; delete some of them (pingo datasets delete)"
    )


#: The `outcome` label of each refusal by a limit in `pingo_workflow_submissions_total`.
REFUSED_OUTCOMES: dict[type[errors.PingoError], str] = {
    errors.TooManyRequests: "rate_limited",
    errors.TooManyWorkflows: "too_many_workflows",
    errors.StorageQuotaExceeded: "storage_quota_exceeded",
}


class StorageQuotas:
    """Whether an owner's next action may start under their storage quota: the last gate,
    before each spawn (`Submitter`), since one workflow admitted under the quota may
    store far past it (`check_storage_quota` sees only what is stored at submission).

    Cached in this node's memory, so a workflow of many short actions does not sum its
    owner's datasets at each spawn: whether any quota is in force at all (the server's
    default, or a user's own, from the user list) for `refresh_s`, and each owner's
    verdict for `verdict_s`. With no quota in force, a spawn costs no store read.
    """

    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        refresh_s: float = 5.0,
        verdict_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.settings = settings
        self.refresh_s = refresh_s
        self.verdict_s = verdict_s
        self.clock = clock
        #: Users' own quotas, and when they were listed.
        self._own: dict[str, int] = {}
        self._listed_at: float | None = None
        #: Owner → (until when, the refusal or None).
        self._verdicts: dict[str, tuple[float, str | None]] = {}

    async def refusal(self, workflow_id: str) -> str | None:
        """Why the owner of `workflow_id` may start nothing more now, or None."""
        if not await self._any_in_force():
            return None
        workflow = await self.store.get_workflow(workflow_id)
        if workflow is None:
            return None
        owner = workflow.owner
        quota = _either(self._own.get(owner), self.settings.user_max_storage_bytes)
        if quota is None:
            return None
        now = self.clock()
        cached = self._verdicts.get(owner)
        if cached is not None and cached[0] > now:
            return cached[1]
        used = await self.store.bytes_produced_by(owner)
        refusal = None if used < quota else _over_quota(owner, used, quota)
        self._verdicts[owner] = (now + self.verdict_s, refusal)
        return refusal

    async def _any_in_force(self) -> bool:
        now = self.clock()
        if self._listed_at is None or now - self._listed_at >= self.refresh_s:
            users = await self.store.list_users()
            self._own = {
                u.name: u.limits.max_storage_bytes
                for u in users
                if u.limits.max_storage_bytes is not None
            }
            self._listed_at = now
            self._verdicts.clear()
        return self.settings.user_max_storage_bytes is not None or bool(self._own)


def count_refusal(refused: type[errors.PingoError]) -> None:
    """Count a submission refused by a limit in `pingo_workflow_submissions_total`.

    In this process: a big submission's child checks the workflow cap and the storage
    quota and counts in its own registry, lost with it, so its parent counts the
    refusal it hears of again.
    """
    metrics.SUBMISSIONS.labels(outcome=REFUSED_OUTCOMES[refused]).inc()


@dataclass(slots=True)
class _Bucket:
    """A token bucket's state: its tokens when last counted, and when that was."""

    tokens: float
    at: float
    #: Whether a refusal was logged already (one log line per refused spell).
    logged: bool = False

    def refilled(self, size: float, per_s: float, now: float) -> float:
        """The tokens at `now`: refilled at `per_s` since `at`, never above `size` (so a
        lowered size takes effect at once)."""
        return min(size, self.tokens + (now - self.at) * per_s)


class SubmissionRate:
    """A token bucket per user, in this node's memory.

    Each user's bucket holds up to `min(burst, rate)` submissions and refills at
    `rate / 60` a second; a submission takes one token or is refused with the
    time until the next one. Buckets exist only for users who submitted (every
    caller is authenticated first), so memory stays bounded by the user count.
    """

    def __init__(self, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def take(self, user: str, per_minute: int | None) -> None:
        """Use one of `user`'s submissions, or raise `errors.TooManyRequests` (429)."""
        if per_minute is None:
            return
        size = min(self.burst, per_minute)
        per_s = per_minute / 60
        now = self.clock()
        bucket = self._buckets.get(user)
        if bucket is None:
            bucket = self._buckets[user] = _Bucket(tokens=size, at=now)
        bucket.tokens = bucket.refilled(size, per_s, now)
        bucket.at = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return
        count_refusal(errors.TooManyRequests)
        raise errors.TooManyRequests(
            f"{user} may submit {per_minute} workflows a minute (bursts of {size}); slow down",
            (1 - bucket.tokens) / per_s,
        )

    def forget(self, user: str) -> None:
        """Drop `user`'s bucket (the user was revoked)."""
        self._buckets.pop(user, None)


class Slots:
    """Things held open at once (event streams, verifications): per user and in total.

    In this node's memory, like the submission buckets: each node caps what it
    serves itself, which is what its threads and descriptors need. Beyond a cap,
    `take` refuses with `errors.TooManyRequests` (429) and takes nothing, so a
    refused request never has to give anything back.
    """

    def __init__(
        self, what: str, *, per_user: int, total: int | None, retry_after_s: float
    ) -> None:
        self.what = what
        self.per_user = per_user
        self.total = total
        self.retry_after_s = retry_after_s
        self._held: dict[str, int] = {}
        self._count = 0

    def held_by(self, user: str) -> int:
        """How many `user` holds now."""
        return self._held.get(user, 0)

    @property
    def count(self) -> int:
        """How many are held now, by everyone."""
        return self._count

    def take(self, user: str) -> None:
        """Hold one more for `user`, or raise `errors.TooManyRequests`."""
        if self.held_by(user) >= self.per_user:
            raise errors.TooManyRequests(
                f"{user} already has {self.per_user} {self.what} open, the most allowed "
                "per user; close one or retry later",
                self.retry_after_s,
            )
        if self.total is not None and self._count >= self.total:
            raise errors.TooManyRequests(
                f"this server already has {self.total} {self.what} open, the most it "
                "allows; retry later",
                self.retry_after_s,
            )
        self._held[user] = self.held_by(user) + 1
        self._count += 1

    def give_back(self, user: str) -> None:
        """Release one of `user`'s; a user with none left is forgotten (bounded memory)."""
        left = self.held_by(user) - 1
        if left < 0:
            raise AssertionError(f"{user} gave back {self.what} they did not hold")
        if left:
            self._held[user] = left
        else:
            del self._held[user]
        self._count -= 1

    @contextlib.contextmanager
    def held(self, user: str) -> Iterator[None]:
        """One slot for the block, given back however it ends (errors, cancellation)."""
        self.take(user)
        try:
            yield
        finally:
            self.give_back(user)


class SignInThrottle:
    """Failed sign-ins per peer address: a token bucket, in this node's memory.

    An address may fail `burst` times in a row, then once every `refill_s` seconds;
    beyond that its sign-ins are refused (429, Retry-After) before the token is
    looked at, correct or not, so that a throttled address gets no answers to its
    guesses. Successful sign-ins cost nothing. Buckets are kept least recently failed
    first: one that has refilled is forgotten, and beyond `max_addresses` the oldest
    is, so memory stays bounded whatever the number of addresses.
    """

    def __init__(
        self,
        burst: int = 10,
        refill_s: float = 6.0,
        max_addresses: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.refill_s = refill_s
        self.max_addresses = max_addresses
        self.clock = clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def check(self, address: str) -> None:
        """Raise `errors.TooManyRequests` when `address` has no failures left."""
        bucket = self._buckets.get(address)
        if bucket is None:
            return
        tokens = self._refilled(bucket, self.clock())
        if tokens >= 1:
            return
        if not bucket.logged:
            bucket.logged = True
            logger.warning(
                "UI sign-ins from %s refused: too many failed sign-ins",
                address,
                extra={"event": "ui_login_throttled", "remote": address},
            )
        raise errors.TooManyRequests(
            "too many failed sign-ins from your address; wait and try again",
            (1 - tokens) * self.refill_s,
        )

    def failed(self, address: str) -> None:
        """Count one failed sign-in of `address`."""
        now = self.clock()
        self._forget_refilled(now)
        bucket = self._buckets.pop(address, None)
        if bucket is None:
            bucket = _Bucket(tokens=self.burst, at=now)
        bucket.tokens = self._refilled(bucket, now) - 1
        bucket.at = now
        if bucket.tokens >= 1:
            bucket.logged = False
        self._buckets[address] = bucket
        while len(self._buckets) > self.max_addresses:
            self._buckets.popitem(last=False)

    def _refilled(self, bucket: _Bucket, now: float) -> float:
        return bucket.refilled(self.burst, 1 / self.refill_s, now)

    def _forget_refilled(self, now: float) -> None:
        # Least recently failed first: stop at the first bucket that is not full again.
        while self._buckets:
            bucket = next(iter(self._buckets.values()))
            if self._refilled(bucket, now) < self.burst:
                return
            self._buckets.popitem(last=False)
