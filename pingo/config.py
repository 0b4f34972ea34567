"""Settings: read once at start-up from `PINGO_*` variables, overridden by CLI flags."""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

from pingo import errors

_SIZE_UNITS = {
    "": 1,
    "B": 1,
    "K": 10**3, "KB": 10**3, "KIB": 2**10,
    "M": 10**6, "MB": 10**6, "MIB": 2**20,
    "G": 10**9, "GB": 10**9, "GIB": 2**30,
    "T": 10**12, "TB": 10**12, "TIB": 2**40,
    "P": 10**15, "PB": 10**15, "PIB": 2**50,
}  # fmt: skip
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str) -> int:
    """Parse `500GB`, `1.5TiB` or a plain byte count into bytes (SI and IEC units)."""
    match = _SIZE_RE.match(text)
    if match is None or match.group(2).upper() not in _SIZE_UNITS:
        raise errors.ConfigurationError(f"not a size: {text!r} (try 500GB, 2TiB or 1000000)")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).upper()])


#: Secrets the server reads from its environment once, then removes from it.
CONSUMED_VARIABLES = ("PINGO_ADMIN_TOKEN",)


def consume_secret_environment() -> None:
    """Remove `CONSUMED_VARIABLES` from this process's environment, once read.

    `os.environ` (and libc's copy) forget them, and their values are blanked in
    the memory the kernel shows as `/proc/<pid>/environ`, which `unsetenv`
    leaves untouched: anything that can read that file must not find the token.
    """
    for name in CONSUMED_VARIABLES:
        value = os.environ.pop(name, None)
        if value:
            _blank_initial_environment(f"{name}=".encode(), len(value.encode()))


def _blank_initial_environment(prefix: bytes, length: int) -> None:
    try:
        with open("/proc/self/stat", "rb") as f:
            # Fields after the parenthesised command name; env_start and env_end are 50 and 51.
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[47]), int(fields[48])
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            block = mem.read(end - start)
            at = 0 if block.startswith(prefix) else block.find(b"\0" + prefix) + 1
            if at or block.startswith(prefix):
                mem.seek(start + at + len(prefix))
                mem.write(b"\0" * length)
    except (OSError, IndexError, ValueError):  # pragma: no cover - not Linux
        pass


def default_home() -> Path:
    """Pingo's per-user directory (e.g. ~/.local/share/pingo on Linux)."""
    return Path(platformdirs.user_data_dir("pingo", appauthor=False))


def _default_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a Pingo node is configured with."""

    home: Path = field(default_factory=default_home)
    host: str = "127.0.0.1"
    port: int = 8642
    #: `sqlite:///path/pingo.db` (default under `home`) or `mongodb://…`.
    store_url: str = ""
    #: Where datasets live: a local directory (default under `home`) or an fsspec URL.
    data_root: str = ""
    #: The first admin's token; generated and written to `home/admin.token` when unset.
    admin_token: str | None = None
    #: URL the cluster uses to reach this node's callbacks (default from host and port).
    public_url: str = ""
    #: `server` (everyone shares datasets) or `user` (each user is their own scope).
    sharing_scope: str = "server"
    #: Storage budget in bytes for retention; None means unlimited.
    storage_capacity_bytes: int | None = None
    retention_policy: str = "cost-benefit"
    #: Retention passes when the bytes on disk exceed this share of the capacity.
    high_water: float = 0.90
    #: The furthest one pass may evict to (`pingo.retention.loop.pass_bytes_to_free`).
    low_water: float = 0.75
    retention_interval_s: float = 5.0
    #: This node's identity in leases and claims.
    node_id: str = field(default_factory=_default_node_id)
    poll_interval_s: float = 1.0
    #: The scraper's adaptive poll for other nodes' work: this short while passes find
    #: work, doubling up to `idle_poll_s` while they find none (see `actions.scraper`).
    fast_poll_s: float = 0.01
    idle_poll_s: float = 0.025
    lease_s: float = 30.0
    #: How long planning a workflow may take, from its start to its store write (a later
    #: write is refused, 503): a planning older than this and a lease, whose workflow was
    #: never stored, died, and the deletor releases the claims it took (docs/states.md).
    plan_deadline_s: float = 600.0
    queue_size: int = 256
    claim_batch: int = 64
    #: Seconds of short actions' work (per slot) a node claims ahead of its slots, so
    #: that claims come in batches; 0 claims by capacity only (`actions.leases`).
    claim_ahead_s: float = 0.1
    submitters: int = 8
    #: Concurrent local subprocesses (default: CPU count).
    local_slots: int = field(default_factory=lambda: os.cpu_count() or 1)
    #: Per-action-type concurrency limits; types not named are unlimited.
    executor_limits: Mapping[str, int] = field(default_factory=dict)
    #: Cluster actions (MapReduce, Spark) one node keeps in flight per type, unless
    #: `executor_limits` names the type: their submission is cheap, their work remote.
    cluster_in_flight: int = 64
    retry_backoff_s: float = 1.0
    deletor_interval_s: float = 1.0
    max_body_bytes: int = 16 * 2**20
    max_actions: int = 100_000
    #: Event streams (SSE) open at once on this node, all users together (429 beyond):
    #: each holds a descriptor and reads the store twice every half second.
    max_event_streams: int = 256
    #: Per-user limits, unless an admin set the user's own (`PATCH /users/{name}`);
    #: None (env: `unlimited`) lifts the limit. Workflows RUNNING at once (429 beyond):
    user_max_workflows: int | None = 100
    #: Actions claimed, submitted or running at once; more wait READY (never refused).
    user_max_in_flight_actions: int | None = 1000
    #: Workflow submissions a minute, refilled continuously (429 beyond), per node.
    user_submissions_per_minute: int | None = 600
    #: Submissions a user may make at once before the rate applies (the bucket's size).
    user_submission_burst: int = 60
    #: Bytes of datasets on disk a user's workflows may have produced; at or past it new
    #: workflows are refused (403 STORAGE_QUOTA_EXCEEDED) and their actions fail to
    #: start, until the user deletes some.
    #: None (env: `unlimited`, the default) lifts it; the env takes sizes such as 200GiB.
    user_max_storage_bytes: int | None = None
    #: Schedules one user may have (403 TOO_MANY_SCHEDULES beyond; admins exempt):
    #: a server setting only, counted in the store. None (env: `unlimited`) lifts it.
    user_max_schedules: int | None = 100
    #: Event streams (SSE) one user may have open at once on this node (429 beyond).
    user_max_event_streams: int = 8
    #: `?verify=true` hashes one user may have running at once on this node (429 beyond).
    user_max_verifications: int = 1
    #: SQLite `synchronous` pragma: NORMAL survives process crashes (kill -9), FULL power loss.
    sqlite_synchronous: str = "NORMAL"
    #: SQLite's page cache per connection, in MiB: bounds the server's memory however
    #: large the store grows (the hot rows of running work fit in a few MiB).
    sqlite_cache_mb: int = 8
    #: MongoDB write concern `w` (an int or "majority").
    mongo_write_concern: str = "majority"
    hadoop_bin: str = "hadoop"
    #: The YARN CLI: kills applications (`yarn application -kill`) and fetches their logs.
    yarn_bin: str = "yarn"
    spark_submit_bin: str = "spark-submit"
    spark_master: str = "local[*]"
    spark_deploy_mode: str = "client"
    #: Grace added to a lease before reconciliation asks an executor for an action's status.
    reconcile_grace_s: float = 30.0
    #: How long a stopping node lets its running command-line actions finish; those still
    #: running then are killed unreported and left to their lease (another node retries).
    stop_grace_s: float = 5.0
    log_level: str = "INFO"
    #: Sandbox for command-line actions: `auto` (when user namespaces work), `on` or `off`.
    sandbox: str = "auto"
    #: `on` (default) or `off`: whether sandboxed actions reach the network.
    sandbox_network: str = "on"
    #: Directories under which a non-admin's local unmanaged `outputPath` may land
    #: (`PINGO_UNMANAGED_ROOTS`, separated by ':'); none (the default): admins' only.
    unmanaged_roots: tuple[str, ...] = ()
    #: `admins` (default) or `everyone`: whose cluster actions may run their code on
    #: this machine, outside the sandbox (`hadoop jar`'s main class, a Spark driver in
    #: client deploy mode or a local master).
    host_clients: str = "admins"
    #: Processes and threads one sandboxed action may have at once (RLIMIT_NPROC, counted
    #: in the action's own user namespace); None (`unlimited`): no limit. The kernel does
    #: not enforce it for a server run as root.
    action_max_processes: int | None = 1024
    #: Virtual memory of each process of a sandboxed action (RLIMIT_AS), bytes; None: no limit.
    action_max_memory: int | None = None
    #: Largest file a sandboxed action may write, its log included (RLIMIT_FSIZE), bytes;
    #: None: no limit.
    action_max_file_size: int | None = None
    #: `admins` (default) or `everyone`: whose command-line actions a server run as root
    #: runs. Sandboxed without any capability, an action of a root server is still root
    #: to the files and sockets the sandbox does not hide (`/etc/shadow`, a Docker socket).
    root_actions: str = "admins"
    #: How often the scheduler looks for due schedule ticks.
    schedule_interval_s: float = 0.2
    #: How long a node's claim on a schedule tick lasts before another node may take it over.
    schedule_lease_s: float = 10.0
    #: A tick later than this is missed (catch-up `none` skips it).
    schedule_grace_s: float = 10.0
    #: How often the webhook sender looks for due deliveries.
    webhook_interval_s: float = 0.5
    #: Attempts per delivery (with exponential backoff from `webhook_backoff_s`).
    webhook_max_attempts: int = 8
    webhook_backoff_s: float = 2.0
    webhook_timeout_s: float = 5.0
    #: `deny` (default) or `allow`: webhooks to loopback, private and link-local addresses.
    webhook_private_targets: str = "deny"

    def __post_init__(self) -> None:
        # Defaults that derive from other fields are resolved here so every
        # reader sees concrete values.
        home = Path(self.home).expanduser()
        object.__setattr__(self, "home", home)
        if not self.store_url:
            object.__setattr__(self, "store_url", f"sqlite:///{home / 'pingo.db'}")
        if not self.data_root:
            object.__setattr__(self, "data_root", str(home / "datasets"))
        if not self.public_url:
            object.__setattr__(self, "public_url", f"http://{self.host}:{self.port}")
        if self.sharing_scope not in ("server", "user"):
            raise errors.ConfigurationError(
                f"sharing scope must be 'server' or 'user', not {self.sharing_scope!r}"
            )
        if self.sandbox not in ("auto", "on", "off"):
            raise errors.ConfigurationError(
                f"PINGO_SANDBOX must be auto, on or off, not {self.sandbox!r}"
            )
        if self.host_clients not in ("admins", "everyone"):
            raise errors.ConfigurationError(
                f"PINGO_HOST_CLIENTS must be admins or everyone, not {self.host_clients!r}"
            )
        if self.root_actions not in ("admins", "everyone"):
            raise errors.ConfigurationError(
                f"PINGO_ROOT_ACTIONS must be admins or everyone, not {self.root_actions!r}"
            )
        if self.sandbox_network not in ("on", "off"):
            raise errors.ConfigurationError(
                f"PINGO_SANDBOX_NETWORK must be on or off, not {self.sandbox_network!r}"
            )
        if self.webhook_private_targets not in ("deny", "allow"):
            raise errors.ConfigurationError(
                "PINGO_WEBHOOK_PRIVATE_TARGETS must be deny or allow, "
                f"not {self.webhook_private_targets!r}"
            )
        if any(os.path.realpath(r.removeprefix("file://")) == "/" for r in self.unmanaged_roots):
            # Every sandbox covers each root: covering / would leave actions nothing.
            raise errors.ConfigurationError(
                "PINGO_UNMANAGED_ROOTS may not hold /: give directories for users' outputs"
            )
        if not 0 < self.low_water <= self.high_water <= 1:
            raise errors.ConfigurationError("water marks need 0 < low <= high <= 1")
        if not 0 <= self.stop_grace_s < float("inf"):
            raise errors.ConfigurationError(
                f"PINGO_STOP_GRACE_S must be 0 or more seconds, not {self.stop_grace_s!r}"
            )
        if not 0 <= self.claim_ahead_s < float("inf"):
            raise errors.ConfigurationError(
                f"PINGO_CLAIM_AHEAD_S must be 0 or more seconds, not {self.claim_ahead_s!r}"
            )
        for name in _USER_LIMITS:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise errors.ConfigurationError(
                    f"PINGO_{name.upper()} must be at least 1 (or 'unlimited'), not {value!r}"
                )

        for name in _ACTION_LIMITS:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise errors.ConfigurationError(
                    f"PINGO_{name.upper()} must be positive (or 'unlimited'), not {value!r}"
                )

        for name in _AT_LEAST_ONE:
            if getattr(self, name) < 1:
                raise errors.ConfigurationError(
                    f"PINGO_{name.upper()} must be at least 1, not {getattr(self, name)!r}"
                )

    @property
    def base_url(self) -> str:
        return self.public_url.rstrip("/")

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes` applied (None values are ignored, as unset CLI flags)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read `PINGO_*` variables, then apply `overrides` (CLI flags; None means unset)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = env.get(f"PINGO_{f.name.upper()}")
            if raw is None or raw == "":
                continue
            values[f.name] = _convert(f.name, raw)
        # Documented alias: PINGO_STORAGE_CAPACITY accepts sizes such as 500GB.
        if env.get("PINGO_STORAGE_CAPACITY"):
            values["storage_capacity_bytes"] = parse_size(env["PINGO_STORAGE_CAPACITY"])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


_INTS = {"port", "queue_size", "claim_batch", "submitters", "local_slots", "max_body_bytes",
         "max_actions", "sqlite_cache_mb", "user_submission_burst",
         "cluster_in_flight", "webhook_max_attempts",
         "max_event_streams", "user_max_event_streams", "user_max_verifications"}  # fmt: skip
#: Caps that must let at least one through (0 would refuse everyone).
_AT_LEAST_ONE = ("max_event_streams", "user_max_event_streams", "user_max_verifications")
#: Per-user limits: a positive int, or `unlimited` for None.
_USER_LIMITS = ("user_max_workflows", "user_max_in_flight_actions",
                "user_submissions_per_minute", "user_submission_burst",
                "user_max_schedules", "user_max_storage_bytes")  # fmt: skip
#: Limits of each sandboxed action: a positive int (sizes: `4GiB`), or `unlimited` for None.
_ACTION_LIMITS = ("action_max_processes", "action_max_memory", "action_max_file_size")
#: Those of them given as sizes.
_ACTION_SIZES = ("action_max_memory", "action_max_file_size")
_FLOATS = {"high_water", "low_water", "retention_interval_s", "poll_interval_s", "lease_s",
           "plan_deadline_s", "claim_ahead_s",
           "fast_poll_s", "idle_poll_s",
           "retry_backoff_s", "deletor_interval_s", "reconcile_grace_s", "stop_grace_s",
           "schedule_interval_s",
           "schedule_lease_s", "schedule_grace_s", "webhook_interval_s", "webhook_backoff_s",
           "webhook_timeout_s"}  # fmt: skip


def _convert(name: str, raw: str) -> Any:
    if name in _USER_LIMITS and name not in _INTS and raw.strip().lower() == "unlimited":
        return None
    if name in _ACTION_LIMITS and raw.strip().lower() == "unlimited":
        return None
    if name in _ACTION_SIZES or name == "user_max_storage_bytes":
        try:
            return parse_size(raw)
        except errors.ConfigurationError as exc:
            raise errors.ConfigurationError(f"PINGO_{name.upper()}: {exc.message}") from exc
    if name == "action_max_processes":
        try:
            return int(raw)
        except ValueError as exc:
            raise errors.ConfigurationError(
                f"PINGO_ACTION_MAX_PROCESSES: not a number or 'unlimited': {raw!r}"
            ) from exc
    try:
        if name in _INTS or name in _USER_LIMITS:
            return int(raw)
        if name in _FLOATS:
            return float(raw)
    except ValueError as exc:
        raise errors.ConfigurationError(f"PINGO_{name.upper()}: not a number: {raw!r}") from exc
    if name == "home":
        return Path(raw)
    if name == "storage_capacity_bytes":
        return parse_size(raw)
    if name == "unmanaged_roots":
        return tuple(p for p in raw.split(os.pathsep) if p)
    if name == "executor_limits":
        # "spark=2,mapreduce-v2=4"
        limits: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in raw.split(","))):
            key, _, value = part.partition("=")
            try:
                limits[key.strip()] = int(value)
            except ValueError as exc:
                raise errors.ConfigurationError(
                    f"PINGO_EXECUTOR_LIMITS: expected type=N pairs, got {part!r}"
                ) from exc
        return limits
    return raw
