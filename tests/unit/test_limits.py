"""The submission token bucket, limits in force, and the `PINGO_USER_*` settings."""

from __future__ import annotations

import pytest

from pingo import errors, limits
from pingo.config import Settings
from pingo.store.protocol import NO_LIMITS, UserLimits


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _refused(rate: limits.SubmissionRate, user: str, per_minute: int | None) -> float:
    with pytest.raises(errors.TooManyRequests) as caught:
        rate.take(user, per_minute)
    assert caught.value.code == "RATE_LIMITED"
    return caught.value.retry_after_s


def test_a_burst_then_the_steady_rate() -> None:
    clock = Clock()
    rate = limits.SubmissionRate(burst=3, clock=clock)
    for _ in range(3):
        rate.take("alice", 60)
    assert _refused(rate, "alice", 60) == pytest.approx(1.0)
    clock.now += 0.5
    assert _refused(rate, "alice", 60) == pytest.approx(0.5)
    clock.now += 0.5
    rate.take("alice", 60)  # one a second at 60 a minute
    assert _refused(rate, "alice", 60) == pytest.approx(1.0)
    # A long pause refills to the burst, never beyond it.
    clock.now += 3600
    for _ in range(3):
        rate.take("alice", 60)
    _refused(rate, "alice", 60)


def test_buckets_are_per_user_and_a_low_rate_caps_the_burst() -> None:
    clock = Clock()
    rate = limits.SubmissionRate(burst=60, clock=clock)
    rate.take("alice", 1)
    # One a minute: the bucket holds one, whatever the server's burst.
    assert _refused(rate, "alice", 1) == pytest.approx(60.0)
    for _ in range(60):
        rate.take("bob", 600)
    _refused(rate, "bob", 600)
    # A user whose limit was lowered is held to the new one at once.
    for _ in range(2):
        rate.take("carol", 600)
    clock.now += 60
    rate.take("carol", 2)
    rate.take("carol", 2)
    _refused(rate, "carol", 2)
    rate.take("dave", None)  # unlimited
    rate.forget("alice")
    rate.take("alice", 1)


def test_retry_after_is_whole_seconds_and_at_least_one() -> None:
    assert errors.TooManyRequests("x", 0.01).retry_after == "1"
    assert errors.TooManyRequests("x", 1.2).retry_after == "2"
    assert errors.TooManyWorkflows("x", 5).retry_after == "5"
    assert errors.TooManyWorkflows("x", 5).code == "TOO_MANY_WORKFLOWS"


def test_own_limits_beat_the_server_defaults() -> None:
    settings = Settings(user_max_workflows=10, user_max_in_flight_actions=None)
    assert limits.effective(NO_LIMITS, settings) == limits.EffectiveLimits(10, None, 600, None)
    own = UserLimits(max_workflows=2, max_in_flight_actions=5, max_storage_bytes=9)
    assert limits.effective(own, settings) == limits.EffectiveLimits(2, 5, 600, 9)
    quota = Settings(user_max_storage_bytes=2**40)
    assert limits.effective(NO_LIMITS, quota).max_storage_bytes == 2**40
    assert limits.merge(own, {"max_workflows": None, "submissions_per_minute": 7}) == UserLimits(
        max_workflows=None, max_in_flight_actions=5, submissions_per_minute=7, max_storage_bytes=9
    )


def test_settings_from_the_environment() -> None:
    settings = Settings.from_env({
        "PINGO_USER_MAX_WORKFLOWS": "unlimited",
        "PINGO_USER_MAX_IN_FLIGHT_ACTIONS": "12",
        "PINGO_USER_SUBMISSIONS_PER_MINUTE": "Unlimited",
        "PINGO_USER_SUBMISSION_BURST": "4",
        "PINGO_USER_MAX_STORAGE_BYTES": "1.5TiB",
    })  # fmt: skip
    assert settings.user_max_storage_bytes == 3 * 2**39
    assert (
        Settings.from_env({"PINGO_USER_MAX_STORAGE_BYTES": "unlimited"}).user_max_storage_bytes
        is None
    )
    assert settings.user_max_workflows is None
    assert settings.user_max_in_flight_actions == 12
    assert settings.user_submissions_per_minute is None
    assert settings.user_submission_burst == 4
    defaults = Settings.from_env({})
    assert (defaults.user_max_workflows, defaults.user_max_in_flight_actions) == (100, 1000)
    assert (defaults.user_submissions_per_minute, defaults.user_submission_burst) == (600, 60)
    assert defaults.user_max_storage_bytes is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PINGO_USER_MAX_WORKFLOWS", "0"),
        ("PINGO_USER_MAX_IN_FLIGHT_ACTIONS", "-3"),
        ("PINGO_USER_SUBMISSIONS_PER_MINUTE", "many"),
        ("PINGO_USER_SUBMISSION_BURST", "unlimited"),
        ("PINGO_USER_SUBMISSION_BURST", "0"),
        ("PINGO_USER_MAX_STORAGE_BYTES", "0"),
        ("PINGO_USER_MAX_STORAGE_BYTES", "lots"),
        ("PINGO_ACTION_MAX_MEMORY", "2 pages"),
    ],
)
def test_bad_limit_settings_are_refused(name: str, value: str) -> None:
    with pytest.raises(errors.ConfigurationError, match=name):
        Settings.from_env({name: value})
