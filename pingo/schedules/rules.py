"""A schedule's definition and the rules of its ticks.

- Cron: five fields (minute to day of week), or six with the seconds FIRST
  (`*/10 * * * * *` is every ten seconds), parsed and iterated by croniter in the
  schedule's `zoneinfo` time zone. Ticks are stored as UTC instants. Across DST
  changes: a local time that does not exist (spring forward) fires at the first
  instant after the gap (croniter's choice); a local time that happens twice
  (fall back) fires once for a job pinned to given hours, as Vixie cron does, and
  twice for one with a wildcard hour (every real minute of the repeated hour runs).
- Catch-up: a tick is *missed* when it is more than `grace_s` late. `none`
  runs only the latest due tick if it is not missed; `latest` runs the latest
  due tick however late; `all` runs every due tick, the most recent `catchUpLimit`
  of them when more are due. Ticks not run are recorded as skipped.
- Data triggers (Oozie's coordinators): instead of a cron, a schedule may name a
  `trigger`: a dataset (`{"dataset": {"workflow", "action"}}`, by the names of the
  owner's workflow and action) that becomes STORED, or a path under the data root
  (`{"path": "incoming/_SUCCESS"}`) that appears. Each occurrence is one tick, at
  the time it happened (the dataset's store, the path's modification time), and is
  claimed once across nodes like a cron tick. The schedule's `next_fire_at` is then
  a watermark: only occurrences at or after it are due.
- Parameters: `{schedule.time}` (the tick, ISO 8601 in the schedule's zone),
  `{schedule.date}` (its local date) and `{param.NAME}` (the schedule's
  `parameters`) are replaced in every string of the workflow document before it
  is submitted, so they are part of each action's provenance identity.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterBadDateError, CroniterError

from pingo import errors, untrusted
from pingo.errors import ValidationIssue

#: Stable error codes of schedule definitions.
INVALID_CRON = "INVALID_CRON"
UNKNOWN_TIMEZONE = "UNKNOWN_TIMEZONE"
UNKNOWN_PARAMETER = "UNKNOWN_PARAMETER"
SCHEMA_VIOLATION = "SCHEMA_VIOLATION"

CATCH_UP_POLICIES = ("none", "latest", "all")
OVERLAP_POLICIES = ("skip", "queue")
#: The largest `catchUpLimit` and `maxConcurrent` accepted.
MAX_CATCH_UP = 1000
MAX_CONCURRENT = 50
#: At most this many skipped ticks are recorded one by one per decision.
MAX_SKIPPED_RECORDED = 100

_FIELDS = frozenset(
    {
        "name",
        "cron",
        "timezone",
        "workflow",
        "parameters",
        "start",
        "end",
        "catchUp",
        "catchUpLimit",
        "maxConcurrent",
        "overlap",
        "webhooks",
        "paused",
        "trigger",
    }
)
#: A path under the data root: relative, no `..`, no empty segment, plain characters.
_TRIGGER_PATH = re.compile(r"[A-Za-z0-9_.=-]+(/[A-Za-z0-9_.=-]+)*")
_NAME_LIMIT = 200
#: Pingo's own dataset directories (`DatasetStorage.path_for`): never a trigger's path,
#: so that a trigger cannot watch another user's datasets appear (in any case: a data
#: root on a case-insensitive filesystem finds `4A/` as `4a/`).
_DATASET_SHARD = re.compile(r"[0-9a-f]{2}", re.IGNORECASE)
_PLACEHOLDER = re.compile(r"\{(schedule\.time|schedule\.date|param\.[A-Za-z0-9_.-]+)\}")
_PARAMETER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
#: Where a cron's expansion starts, and whence it must fire (no start before it is
#: checked further: ticks are computed from now, which is later).
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
#: What computing a tick raises when it would fall outside Python's calendar (past the
#: year 9999, in UTC or in the schedule's zone), or when croniter finds no match within
#: the 50 years it searches.
_NO_TICK = (OverflowError, ValueError, CroniterBadDateError)


@dataclass(frozen=True, slots=True)
class Trigger:
    """What fires a data-triggered schedule: a dataset stored, or a path appearing."""

    #: "dataset" or "path".
    kind: str
    #: The owner's workflow and action whose output is watched ("dataset").
    workflow: str | None = None
    action: str | None = None
    #: Relative to the data root ("path").
    path: str | None = None


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A schedule's definition, checked."""

    name: str
    cron: str
    timezone: str
    workflow: Mapping[str, Any]
    parameters: Mapping[str, str]
    start_at: datetime | None
    end_at: datetime | None
    catch_up: str
    catch_up_limit: int
    max_concurrent: int | None
    overlap: str
    webhooks: tuple[Mapping[str, Any], ...]
    #: Fires on data instead of a cron (then `cron` is "").
    trigger: Trigger | None = None

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)


# ------------------------------------------------------------------------ parsing


def parse_spec(body: Any) -> ScheduleSpec:
    """Check a schedule definition (the API's body); raise `ValidationFailed` with every issue.

    The workflow document itself is checked by the workflow language, not here.
    """
    if not isinstance(body, Mapping):
        raise _failed([ValidationIssue(SCHEMA_VIOLATION, "a schedule must be an object", "")])
    issues = [
        ValidationIssue(SCHEMA_VIOLATION, f"unknown field {key!r}", f"/{key}")
        for key in body
        if key not in _FIELDS
    ]
    name = _string(body, "name", issues, required=True, max_length=200)
    trigger = _trigger(body.get("trigger"), issues) if "trigger" in body else None
    if trigger is not None and "cron" in body:
        issues.append(ValidationIssue(SCHEMA_VIOLATION, "a cron or a trigger, not both", "/cron"))
    cron = "" if "trigger" in body else _string(body, "cron", issues, required=True, max_length=200)
    timezone = _string(body, "timezone", issues, default="UTC", max_length=100)
    zone = _zone(timezone, issues)
    cron_fires = bool(cron) and zone is not None and _check_cron(cron, issues)
    workflow = body.get("workflow")
    if not isinstance(workflow, Mapping):
        issues.append(
            ValidationIssue(SCHEMA_VIOLATION, "a workflow document (object)", "/workflow")
        )
        workflow = {}
    parameters = _parameters(body.get("parameters", {}), issues)
    start_at = _instant(body, "start", zone, issues)
    end_at = _instant(body, "end", zone, issues)
    if start_at and end_at and end_at < start_at:
        issues.append(ValidationIssue(SCHEMA_VIOLATION, "end is before start", "/end"))
    catch_up = _choice(body, "catchUp", CATCH_UP_POLICIES, "latest", issues)
    catch_up_limit = _int(body, "catchUpLimit", 100, 1, MAX_CATCH_UP, issues)
    max_concurrent = _int(body, "maxConcurrent", None, 1, MAX_CONCURRENT, issues)
    overlap = _choice(body, "overlap", OVERLAP_POLICIES, "skip", issues)
    paused = body.get("paused", False)
    if not isinstance(paused, bool):
        issues.append(ValidationIssue(SCHEMA_VIOLATION, "true or false", "/paused"))
    webhooks = body.get("webhooks", [])
    if not isinstance(webhooks, list):
        issues.append(ValidationIssue(SCHEMA_VIOLATION, "a list of webhooks", "/webhooks"))
        webhooks = []
    issues.extend(unknown_parameters(workflow, parameters))
    if issues:
        raise _failed(issues)
    spec = ScheduleSpec(
        name=name,
        cron=cron,
        timezone=timezone,
        workflow=workflow,
        parameters=parameters,
        start_at=start_at,
        end_at=end_at,
        catch_up=catch_up,
        catch_up_limit=catch_up_limit if catch_up_limit is not None else 100,
        max_concurrent=max_concurrent,
        overlap=overlap,
        webhooks=tuple(w for w in webhooks if isinstance(w, Mapping)),
        trigger=trigger,
    )
    if cron_fires and not _ticks_from_start(spec):
        # Checked on the whole spec (its zone, its cron), hence only once all else passed.
        raise _failed(
            [
                ValidationIssue(
                    SCHEMA_VIOLATION,
                    "no tick of the cron falls at or after the start within the calendar "
                    "(which ends with the year 9999)",
                    "/start",
                )
            ]
        )
    return spec


def _trigger(value: Any, issues: list[ValidationIssue]) -> Trigger | None:
    """`{"dataset": {"workflow": name, "action": name}}` or `{"path": relative path}`."""
    if isinstance(value, Mapping) and set(value) == {"dataset"}:
        watched = value["dataset"]
        if isinstance(watched, Mapping) and set(watched) == {"workflow", "action"}:
            workflow = _string(watched, "workflow", [], required=True, max_length=_NAME_LIMIT)
            action = _string(watched, "action", [], required=True, max_length=_NAME_LIMIT)
            if workflow and action:
                return Trigger("dataset", workflow=workflow, action=action)
        issues.append(
            ValidationIssue(
                SCHEMA_VIOLATION,
                f"{{workflow, action}}: the names (1 to {_NAME_LIMIT} characters) of your "
                "workflow and of its action whose dataset is watched",
                "/trigger/dataset",
            )
        )
        return None
    if isinstance(value, Mapping) and set(value) == {"path"}:
        path = value["path"]
        if (
            isinstance(path, str)
            and len(path) <= 500
            and _TRIGGER_PATH.fullmatch(path)
            and not any(part.startswith(".") for part in path.split("/"))
            and not _DATASET_SHARD.fullmatch(path.split("/")[0])
        ):
            return Trigger("path", path=path)
        issues.append(
            ValidationIssue(
                SCHEMA_VIOLATION,
                "a path relative to the data root, outside Pingo's own datasets: segments of "
                "letters, digits and _ . = -, none starting with '.', the first not two hex "
                "digits in either case (a dataset directory), at most 500 characters",
                "/trigger/path",
            )
        )
        return None
    issues.append(
        ValidationIssue(SCHEMA_VIOLATION, '{"dataset": {...}} or {"path": "..."}', "/trigger")
    )
    return None


def _failed(issues: list[ValidationIssue]) -> errors.ValidationFailed:
    return errors.ValidationFailed(issues, f"the schedule is invalid: {issues[0].message}")


def _string(
    body: Mapping[str, Any],
    key: str,
    issues: list[ValidationIssue],
    *,
    required: bool = False,
    default: str = "",
    max_length: int,
) -> str:
    value = body.get(key)
    if value is None and not required:
        return default
    if not isinstance(value, str) or not value or len(value) > max_length or "\x00" in value:
        issues.append(
            ValidationIssue(SCHEMA_VIOLATION, f"1 to {max_length} characters, no NUL", f"/{key}")
        )
        return ""
    return value


def _zone(name: str, issues: list[ValidationIssue]) -> ZoneInfo | None:
    if not name:
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        issues.append(ValidationIssue(UNKNOWN_TIMEZONE, f"no time zone {name!r}", "/timezone"))
        return None


def _check_cron(cron: str, issues: list[ValidationIssue]) -> bool:
    """Whether `cron` is an expression that fires; if not, say why at `/cron`."""
    fields = cron.split()
    if len(fields) not in (5, 6):
        issues.append(
            ValidationIssue(
                INVALID_CRON, "5 fields, or 6 with the seconds first, separated by spaces", "/cron"
            )
        )
        return False
    try:
        _expanded(cron)
    except (CroniterError, ValueError, KeyError, IndexError) as exc:
        issues.append(ValidationIssue(INVALID_CRON, f"not a cron expression: {exc}", "/cron"))
        return False
    try:
        # Each field may be valid and the date they make impossible (30 February):
        # croniter then searches 50 years for a match and gives up.
        _iterator(cron, _EPOCH).get_next(datetime)
    except CroniterBadDateError:
        issues.append(
            ValidationIssue(
                INVALID_CRON, "never fires: its fields make no date (like 30 February)", "/cron"
            )
        )
        return False
    return True


def _ticks_from_start(spec: ScheduleSpec) -> bool:
    """Whether a tick can be computed at or after the start (one in the year 9999 may
    have none left before the calendar ends)."""
    if spec.start_at is None or spec.start_at <= _EPOCH:
        return True
    return _tick_after(spec, spec.start_at - timedelta(microseconds=1)) is not None


def _parameters(value: Any, issues: list[ValidationIssue]) -> dict[str, str]:
    if not isinstance(value, Mapping):
        issues.append(ValidationIssue(SCHEMA_VIOLATION, "an object of strings", "/parameters"))
        return {}
    checked: dict[str, str] = {}
    for key, item in value.items():
        if not _PARAMETER_NAME.match(key) or not isinstance(item, str) or "\x00" in item:
            issues.append(
                ValidationIssue(
                    SCHEMA_VIOLATION,
                    "a name of letters, digits, '_', '.', '-' and a string value",
                    f"/parameters/{untrusted.pointer_token(key)}",
                )
            )
            continue
        checked[key] = item
    return checked


def _instant(
    body: Mapping[str, Any], key: str, zone: ZoneInfo | None, issues: list[ValidationIssue]
) -> datetime | None:
    value = body.get(key)
    if value is None:
        return None
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        at = datetime.fromisoformat(value)
    except ValueError:
        issues.append(ValidationIssue(SCHEMA_VIOLATION, "an ISO 8601 date and time", f"/{key}"))
        return None
    if at.tzinfo is None:
        # A local time, in the schedule's zone.
        at = at.replace(tzinfo=zone or UTC)
    try:
        return at.astimezone(UTC)
    except OverflowError:
        # 9999-12-31T20:00 at UTC-12 is in the year 10000 in UTC, past what datetime holds.
        issues.append(
            ValidationIssue(
                SCHEMA_VIOLATION, "a date and time from the year 1 to 9999 in UTC", f"/{key}"
            )
        )
        return None


def _choice(
    body: Mapping[str, Any],
    key: str,
    allowed: tuple[str, ...],
    default: str,
    issues: list[ValidationIssue],
) -> str:
    value = body.get(key, default)
    if value not in allowed:
        issues.append(ValidationIssue(SCHEMA_VIOLATION, f"one of {', '.join(allowed)}", f"/{key}"))
        return default
    return str(value)


def _int(
    body: Mapping[str, Any],
    key: str,
    default: int | None,
    minimum: int,
    maximum: int,
    issues: list[ValidationIssue],
) -> int | None:
    value = body.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        issues.append(
            ValidationIssue(SCHEMA_VIOLATION, f"an integer from {minimum} to {maximum}", f"/{key}")
        )
        return default
    return value


# -------------------------------------------------------------------------- ticks


@functools.lru_cache(maxsize=4096)
def _expanded(cron: str) -> croniter:
    return croniter(cron, _EPOCH, second_at_beginning=True)


def _iterator(cron: str, start: datetime) -> croniter:
    """A croniter at `start`: a copy of one expanded once per expression (expanding the
    fields is most of croniter's cost, and a per-second schedule iterates every second)."""
    it = copy.copy(_expanded(cron))
    it.set_current(start, force=True)
    return it


def first_due(spec: ScheduleSpec, now: datetime) -> datetime | None:
    """A new (or resumed) schedule's `next_fire_at`: its next cron tick, or for a data
    trigger the watermark `now` (what happened while it did not exist or was paused is
    not run)."""
    if spec.trigger is not None:
        return now
    return next_tick(spec, now)


def next_tick(spec: ScheduleSpec, after: datetime) -> datetime | None:
    """The first tick strictly after `after` (and at or after the start), or None past the
    end: the schedule's `end`, or the calendar's (the year 9999)."""
    if spec.start_at is not None and after < spec.start_at:
        after = spec.start_at - timedelta(microseconds=1)
    tick = _tick_after(spec, after)
    if tick is None or (spec.end_at is not None and tick > spec.end_at):
        return None
    return tick


def _tick_after(spec: ScheduleSpec, after: datetime) -> datetime | None:
    """The first cron tick strictly after `after`, whatever the start and end; None when
    none can be computed (`_NO_TICK`): the schedule then ends, as after its `end`, rather
    than raising in the scheduler at every pass."""
    try:
        it = _iterator(spec.cron, after.astimezone(spec.zone))
        tick = it.get_next(datetime).astimezone(UTC)
        if _repeats_wall_time(spec, tick):
            tick = it.get_next(datetime).astimezone(UTC)
    except _NO_TICK:
        return None
    return tick


def in_calendar(spec: ScheduleSpec, tick: datetime) -> bool:
    """Whether a data trigger's occurrence at `tick` can run: its local time in the
    schedule's zone (`{schedule.time}`) and the watermark just after it exist (a remote
    file's modification time may be as late as the year 9999)."""
    try:
        tick.astimezone(spec.zone)
        tick + timedelta(microseconds=1)
    except OverflowError:
        return False
    return True


def _repeats_wall_time(spec: ScheduleSpec, tick: datetime) -> bool:
    """Whether `tick` is the second pass of a local time (fall back) for a job pinned to
    given hours: like Vixie cron, such a job runs once; one with a wildcard hour runs
    through the repeated hour as through any other."""
    local = tick.astimezone(spec.zone)
    if not local.fold:
        return False
    fields = spec.cron.split()
    hour = fields[2] if len(fields) == 6 else fields[1]
    if hour.startswith("*"):
        return False
    first_pass = local.replace(fold=0)
    return first_pass.utcoffset() != local.utcoffset()


def _ticks_back(spec: ScheduleSpec, upto: datetime) -> Iterator[datetime]:
    """Ticks at or before `upto`, latest first (never before the start)."""
    it = _iterator(spec.cron, (upto + timedelta(microseconds=1)).astimezone(spec.zone))
    while True:
        tick = it.get_prev(datetime).astimezone(UTC)
        if spec.start_at is not None and tick < spec.start_at:
            return
        yield tick


@dataclass(frozen=True, slots=True)
class TickDecision:
    """What to do with the due ticks of a schedule, decided in one claim."""

    #: The tick to run now, or None when every due tick is skipped.
    run: datetime | None
    #: Due ticks not run (the latest `MAX_SKIPPED_RECORDED` of them, latest first).
    skipped: tuple[datetime, ...]
    #: The schedule's next tick after this decision (None once it ended).
    next_fire_at: datetime | None


def decide(spec: ScheduleSpec, first_due: datetime, now: datetime, grace_s: float) -> TickDecision:
    """Which of the ticks due since `first_due` (included) to run, per the catch-up policy.

    Runs at most one tick: the scheduler claims ticks one by one, so under `all`
    the following ones are due again right after.
    """
    following = next_tick(spec, first_due)
    if following is None or following > now:
        # The common case, on time or nearly: one tick due, nothing to walk back over.
        if spec.catch_up == "none" and (now - first_due).total_seconds() > grace_s:
            return TickDecision(None, (first_due,), following)
        return TickDecision(first_due, (), following)
    end = now if spec.end_at is None else min(now, spec.end_at)
    # The due ticks, latest first, as far back as any policy may look.
    wanted = spec.catch_up_limit if spec.catch_up == "all" else 1
    due: list[datetime] = []
    for tick in _ticks_back(spec, end):
        if tick < first_due or len(due) > wanted:
            break
        due.append(tick)
    if not due:
        return TickDecision(None, (), next_tick(spec, now))
    latest = due[0]
    if spec.catch_up == "all":
        run = due[min(len(due), wanted) - 1]
    elif spec.catch_up == "latest" or (now - latest).total_seconds() <= grace_s:
        run = latest
    else:
        run = None
    skipped = _skipped(spec, first_due, run if run is not None else latest, include=run is None)
    return TickDecision(run, skipped, next_tick(spec, run if run is not None else latest))


def _skipped(
    spec: ScheduleSpec, first_due: datetime, upto: datetime, *, include: bool
) -> tuple[datetime, ...]:
    """Ticks from `first_due` to `upto` (`upto` itself only if `include`), latest first.

    At most `MAX_SKIPPED_RECORDED`: after a long outage of a per-second cron, walking
    back every skipped tick would take longer than the outage is worth.
    """
    listed: list[datetime] = []
    for tick in _ticks_back(spec, upto):
        if tick < first_due or len(listed) >= MAX_SKIPPED_RECORDED:
            break
        if tick != upto or include:
            listed.append(tick)
    return tuple(listed)


# --------------------------------------------------------------------- parameters


def unknown_parameters(
    workflow: Mapping[str, Any], parameters: Mapping[str, str]
) -> list[ValidationIssue]:
    """`{param.NAME}` placeholders in the workflow naming no parameter."""
    issues = []
    for where, text in _strings(workflow, "/workflow"):
        for match in _PLACEHOLDER.finditer(text):
            token = match.group(1)
            if token.startswith("param.") and token[6:] not in parameters:
                issues.append(
                    ValidationIssue(UNKNOWN_PARAMETER, f"no parameter {token[6:]!r}", where)
                )
    return issues


def render(spec: ScheduleSpec, tick: datetime) -> dict[str, Any]:
    """The workflow document to submit for `tick`, with every placeholder replaced."""
    local = tick.astimezone(spec.zone)
    values = {"schedule.time": local.isoformat(), "schedule.date": local.date().isoformat()}
    values.update({f"param.{k}": v for k, v in spec.parameters.items()})

    def substitute(value: Any) -> Any:
        if isinstance(value, str):
            return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), value)
        if isinstance(value, list):
            return [substitute(v) for v in value]
        if isinstance(value, Mapping):
            return {k: substitute(v) for k, v in value.items()}
        return value

    rendered: dict[str, Any] = substitute(dict(spec.workflow))
    return rendered


def _strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        if "{" in value:
            yield where, value
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, f"{where}/{i}")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _strings(item, f"{where}/{untrusted.pointer_token(key)}")


def idempotency_key(schedule_id: str, tick: datetime) -> str:
    """The key a tick's workflow is submitted with: the same tick never makes two workflows."""
    return f"schedule:{schedule_id}:{tick.astimezone(UTC).isoformat()}"


def schedule_of(idempotency: str | None) -> str | None:
    """The schedule id a workflow was submitted for, from its idempotency key."""
    if idempotency is None or not idempotency.startswith("schedule:"):
        return None
    return idempotency.split(":", 2)[1]
