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
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pingo.actions.executors import placeholders

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
