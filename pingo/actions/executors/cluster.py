"""What MapReduce and Spark actions share: shipped files, and finding and killing their jobs.

- Shipped files: an action's `files`, `libjars` and `archives` (lists of paths or
  URLs, placeholders resolved) and `properties` (a map) become Hadoop's generic
  options `-files a,b -libjars … -archives … -D k=v` or Spark's `--files`,
  `--jars`, `--archives`, `--conf k=v`.
- Finding jobs: a cluster client prints what it submitted to its log (the
  attempt's log): YARN application ids (`application_<cluster>_<n>`, Hadoop's
  `Submitted application …`, Spark on YARN), Spark standalone driver ids
  (`driver-<time>-<n>`) and tracking or UI URLs. `scan_log` reads them back, for
  kills and for `pingo logs`.
- Killing jobs: `yarn application -kill <id>` for each application (Spark
  standalone cluster mode: `spark-submit --master M --kill <driver>`). Each
  outcome is logged; a job already killed by this executor is not killed again.
- Host files: the client reads the local files an action names and ships them
  to the cluster, as the server's OS user. `host_file_refusal` is the one rule
  for what a non-admin may name there (the API at submission, the submitter
  before the spawn).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pingo.actions.executors import placeholders
from pingo.config import Settings

logger = logging.getLogger(__name__)

#: How much of a client log `scan_log` reads: clients print their ids at the start.
SCAN_BYTES = 1 << 20
#: Seconds a kill command may take before it is given up (and logged as failed).
KILL_TIMEOUT_S = 60.0

_APPLICATION = re.compile(r"\bapplication_\d+_\d+\b")
_DRIVER = re.compile(r"\bdriver-\d{14}-\d{4,}\b")
#: URLs as RFC 3986 spells them: no space, quote, angle bracket or control character
#: (a log is the job's own text, shown in terminals and pages).
_URL = re.compile(
    r"(?:tracking URL|The url to track the job|Spark UI|SparkUI|started at)\W{0,3}"
    r"(https?://[A-Za-z0-9\-._~:/?#\[\]@!$&()*+,;=%]+)",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class ClusterJobs:
    """What a cluster client's log says it submitted."""

    application_ids: tuple[str, ...] = ()
    driver_ids: tuple[str, ...] = ()
    urls: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.application_ids or self.driver_ids or self.urls)


def find_jobs(text: str) -> ClusterJobs:
    """The YARN applications, Spark drivers and URLs named in `text`, first seen first."""
    return ClusterJobs(
        application_ids=_unique(_APPLICATION.findall(text)),
        driver_ids=_unique(_DRIVER.findall(text)),
        urls=_unique(m.rstrip(".,;)") for m in _URL.findall(text)),
    )


def scan_log(path: Path) -> ClusterJobs:
    """`find_jobs` over the start of a client's log (nothing when there is no log)."""
    try:
        with open(path, "rb") as f:
            text = f.read(SCAN_BYTES).decode("utf-8", "replace")
    except OSError:
        return ClusterJobs()
    return find_jobs(text)


def logs_command(application_id: str) -> list[str]:
    """The YARN CLI's argv that fetches an application's aggregated logs (without `yarn`)."""
    return ["logs", "-applicationId", application_id]


def _unique(items: Any) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def shipped(
    definition: Mapping[str, Any], output: str, inputs: Mapping[int, str]
) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The action's `files`, `libjars`, `archives` (resolved) and its `properties`."""
    lists = {
        key: [
            placeholders.resolve_argument(str(p), output, inputs) for p in definition.get(key, [])
        ]
        for key in ("files", "libjars", "archives")
    }
    props = {
        str(k): placeholders.resolve_argument(str(v), output, inputs)
        for k, v in sorted(definition.get("properties", {}).items())
    }
    return lists, props


#: Shipped-file field → (Hadoop generic option, spark-submit option).
_OPTIONS = {"files": ("-files", "--files"), "libjars": ("-libjars", "--jars"),
            "archives": ("-archives", "--archives")}  # fmt: skip


def file_options(lists: Mapping[str, Sequence[str]], *, spark: bool) -> list[str]:
    """`-files a,b`-style options (Spark's spelling with `spark`) for the non-empty lists."""
    argv: list[str] = []
    for key, (hadoop_option, spark_option) in _OPTIONS.items():
        if lists.get(key):
            argv += [spark_option if spark else hadoop_option, ",".join(lists[key])]
    return argv


async def run_kill(argv: list[str], job: str) -> bool:
    """Run one kill command for `job`; log its outcome; True when it exited 0."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(process.communicate(), KILL_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        logger.warning(
            "killing %s failed: %s",
            job,
            exc,
            extra={"event": "cluster_kill_failed", "job": job},
        )
        return False
    said = out.decode("utf-8", "replace").strip()[-500:]
    if process.returncode == 0:
        logger.info(
            "killed %s: %s",
            job,
            said,
            extra={"event": "cluster_killed", "job": job},
        )
        return True
    logger.warning(
        "killing %s failed (exit %s): %s",
        job,
        process.returncode,
        said,
        extra={"event": "cluster_kill_failed", "job": job, "exit": process.returncode},
    )
    return False


#: Per cluster action type: the fields whose every entry is a file the client opens on
#: this machine when it has no remote scheme (Spark's `--files` and the rest; Hadoop
#: resolves its generic options the same way), and the string maps whose values the
#: client may read as files (`--conf`/`-D` keys naming files are many and change across
#: versions, so their values are judged, whatever the key).
_HOST_FILE_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "spark": (("application", "files", "libjars", "archives"), ("conf", "properties")),
    "mapreduce-v1": (("jar", "files", "libjars", "archives"), ("configuration", "properties")),
    "mapreduce-v2": (("jar", "files", "libjars", "archives"), ("configuration", "properties")),
}
#: A URI scheme at the start of an entry (`hdfs:`, `file:`, `local:`).
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
#: A whole URI as RFC 3986 spells it. Anything else is no URI to Spark (`Utils.resolveURI`
#: falls back to a file relative to the working directory), so it is judged as a path.
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[A-Za-z0-9\-._~:/?#\[\]@!$&()*+;=%]*")
#: Schemes of this machine's files: `file:`; Spark's `local:` (a path on each node, and
#: this machine may be one).
_LOCAL_SCHEMES = frozenset({"file", "local"})
#: Hadoop's nested URIs with a `file` authority (`jceks://file/…`, `har://file-localhost/…`).
_NESTED_LOCAL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://file(?:[-/:@]|$)", re.IGNORECASE)

HOST_FILE_DETAIL = (
    "action {action}: {field} {value!r} names a file on this server's machine ({why});"
    " the {type} client runs here, as the server's OS user, and would read it and ship it"
    " to the cluster. A non-admin may name only remote URIs there (hdfs://, s3a://, gs://,"
    " abfs://, viewfs://, https://, …), or a parent's dataset ({{input:<id>}}) when the"
    " data root is remote; a conf value that is a cluster path needs its scheme"
    " (hdfs:///…). Only admins may name local files, unless PINGO_HOST_CLIENTS=everyone"
    " (see docs/security.md, Cluster actions)"
)


@dataclass(frozen=True, slots=True)
class _Entry:
    """One value of a host-file field, as written."""

    #: The field as a message names it: `files`, `conf 'spark.yarn.dist.files'`.
    field: str
    value: str
    #: Whether the value is a path (list) by its field, else text that may hold paths.
    is_path: bool


def host_file_refusal(
    action: Mapping[str, Any],
    output: str,
    inputs: Mapping[int, str],
    settings: Settings,
) -> str | None:
    """Why a non-admin's cluster `action` may not run here: once `{output}` and
    `{input:<id>}` are resolved to `output` and `inputs`, a field the client reads on
    this machine names a local file (no scheme, `file:`, `local:`, a relative path);
    None when none does, or when every user is trusted (`PINGO_HOST_CLIENTS=everyone`)."""
    kind = action.get("type")
    if settings.host_clients == "everyone" or not isinstance(kind, str):
        return None
    for entry in _entries(action, kind):
        why = _local_value(entry, output, inputs)
        if why is not None:
            value = entry.value[:200]
            return HOST_FILE_DETAIL.format(
                action=action.get("id"), field=entry.field, value=value, why=why, type=kind
            )
    return None


def names_host_files(action_type: str) -> bool:
    """Whether actions of `action_type` have fields a client reads on this machine."""
    return action_type in _HOST_FILE_FIELDS


def _entries(action: Mapping[str, Any], kind: str) -> list[_Entry]:
    """Every value of `action`'s host-file fields (none for a type that has none)."""
    path_fields, map_fields = _HOST_FILE_FIELDS.get(kind, ((), ()))
    found: list[_Entry] = []
    for field in path_fields:
        value = action.get(field)
        values = value if isinstance(value, list) else [value]
        found += [_Entry(field, v, True) for v in values if isinstance(v, str)]
    for field in map_fields:
        table = action.get(field)
        if isinstance(table, Mapping):
            found += [
                _Entry(f"{field} {k!r}", v, False) for k, v in table.items() if isinstance(v, str)
            ]
    return found


def _local_value(entry: _Entry, output: str, inputs: Mapping[int, str]) -> str | None:
    """Why `entry` (a comma list, as both clients split one) names a local file, if it does."""
    try:
        resolved = placeholders.resolve_argument(entry.value, output, inputs)
    except placeholders.PlaceholderError:
        return None  # not a parent: the language refuses the document (UNKNOWN_ACTION_ID)
    for part in resolved.split(","):
        # Spark skips blank parts but does not trim the others: " hdfs://x" is a local path.
        why = _local_reason(part, is_path=entry.is_path) if part.strip() else None
        if why is not None:
            return why
    return None


def _local_reason(part: str, *, is_path: bool) -> str | None:
    """Why one entry names a file on this machine, else None.

    In a path field every entry is a path. A conf value is text: there an entry is a
    path when its form says so (absolute, `~`, `.`, a `/`), and a bare word (`4g`, a
    class name) or an option only when it names something in the working directory
    the clients inherit from the server, against which they resolve relative paths.
    """
    scheme = _SCHEME.match(part)
    if scheme is not None:
        name = scheme.group(1).lower()
        if name in _LOCAL_SCHEMES:
            return f"a {name}: URI"
        if _NESTED_LOCAL.match(part):
            return f"a {name}: URI over this machine's file system"
        if _URI.fullmatch(part):
            return None
    if part.startswith("/"):
        return "an absolute path"
    # An option (`-XX:HeapDumpPath=/tmp/x`) is no path, unless one of that very name
    # is in the working directory: the check below.
    looks_relative = part.startswith(("~", ".")) or "/" in part
    if is_path or (looks_relative and not part.startswith("-")):
        return "a relative path, resolved against the server's working directory"
    if os.path.lexists(part):  # relative: to the working directory, the clients' too
        return "a file in the server's working directory"
    return None
