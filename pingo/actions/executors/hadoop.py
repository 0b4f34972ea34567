"""MapReduce v1 and v2 actions through the `hadoop` command line.

`hadoop jar JAR [MAINCLASS] [-files …] [-libjars …] [-archives …] -D key=value …
ARGUMENTS`: without `mainClass` the jar's manifest names the main class, as
`hadoop jar` decides. The generic options come from `files`, `libjars`,
`archives` and `properties` (see `cluster`); the action's `configuration` and
`properties` become `-D` properties, `queue` the queue property of its
generation, and the job-end notification URL points at Pingo's signed GET
callback with `$jobStatus` left for Hadoop to fill in. The job writes to the
staging path (`{output}`); the success callback promotes it.

The options go where the job's `ToolRunner` parses them: first, unless an
argument is exactly `{options}`, which they replace. A jar whose manifest's main
class dispatches to programs by name (Hadoop's own examples jar, any
`ProgramDriver`) reads that name first and hands the program the rest:
`"arguments": ["wordcount", "{options}", "{input:1}", "{output}"]`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pingo.actions.executors import cluster, placeholders
from pingo.actions.executors.base import Reporter, Submission
from pingo.actions.executors.client import ClientProcessExecutor, find_program
from pingo.config import Settings


@dataclass(frozen=True, slots=True)
class Generation:
    """What differs between MapReduce v1 (JobTracker) and v2 (YARN) job properties."""

    action_type: str
    queue_property: str
    notification_property: str


#: The argument the generic options and `-D` properties replace (else they go first).
OPTIONS = "{options}"

MR1 = Generation("mapreduce-v1", "mapred.job.queue.name", "job.end.notification.url")
MR2 = Generation("mapreduce-v2", "mapreduce.job.queuename", "mapreduce.job.end-notification.url")


def notification_url(submission: Submission) -> str:
    """Pingo's GET callback for this attempt; Hadoop substitutes `$jobStatus`."""
    return (
        f"{submission.callback_url}?attempt={submission.attempt}"
        f"&token={submission.callback_token}&status=$jobStatus"
    )


def hadoop_command(hadoop: str, generation: Generation, submission: Submission) -> list[str]:
    """The `hadoop jar` argv for one attempt of a MapReduce action."""
    action: Mapping[str, Any] = submission.definition
    output, inputs = submission.output_path, submission.inputs
    properties: dict[str, str] = {
        key: placeholders.resolve_argument(str(value), output, inputs)
        for key, value in sorted(action.get("configuration", {}).items())
    }
    files, extra = cluster.shipped(action, output, inputs)
    properties.update(extra)
    if action.get("queue"):
        properties[generation.queue_property] = str(action["queue"])
    properties[generation.notification_property] = notification_url(submission)
    options = cluster.file_options(files, spark=False)
    for key, value in properties.items():
        options += ["-D", f"{key}={value}"]
    before, after = _around_options([str(a) for a in action.get("arguments", [])])
    argv = [hadoop, "jar", str(action["jar"])]
    if action.get("mainClass"):
        argv.append(str(action["mainClass"]))
    argv += placeholders.resolve_argv(before, output, inputs)
    argv += options
    argv += placeholders.resolve_argv(after, output, inputs)
    return argv


def _around_options(arguments: list[str]) -> tuple[list[str], list[str]]:
    """The arguments before and after the options: around the first `{options}`, else all after."""
    if OPTIONS not in arguments:
        return [], arguments
    at = arguments.index(OPTIONS)
    return arguments[:at], arguments[at + 1 :]


class HadoopExecutor(ClientProcessExecutor):
    """Runs MapReduce jobs of one generation through `hadoop jar`."""

    def __init__(self, settings: Settings, reporter: Reporter, generation: Generation) -> None:
        super().__init__(settings, reporter, generation.action_type)
        self.generation = generation
        self.hadoop = find_program(settings.hadoop_bin, "PINGO_HADOOP_BIN")

    def build_command(self, submission: Submission) -> list[str]:
        return hadoop_command(self.hadoop, self.generation, submission)


def create_v1(settings: Settings, reporter: Reporter) -> HadoopExecutor:
    """Entry point for `mapreduce-v1` actions."""
    return HadoopExecutor(settings, reporter, MR1)


def create_v2(settings: Settings, reporter: Reporter) -> HadoopExecutor:
    """Entry point for `mapreduce-v2` actions."""
    return HadoopExecutor(settings, reporter, MR2)
