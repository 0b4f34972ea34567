"""Spark actions through `spark-submit`, reporting through the callbacks by a wrapper.

Master and deploy mode come from the server's settings (`local[*]` on the
embedded setup; `yarn` or `k8s://…` in production); the action's `conf` and
`properties` become `--conf` pairs, its `files`, `libjars` and `archives`
`--files`, `--jars` and `--archives` (see `cluster`). The wrapper
(`pingo.actions.executors.spark_wrapper`) runs spark-submit and calls Pingo's
signed callbacks: running at start, success or failed at the end.

A kill stops the spark-submit client (in client mode the driver with it) and,
in cluster mode, the driver on the cluster: `yarn application -kill` for a YARN
application, `spark-submit --master M --kill <driver>` for a standalone driver.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from pingo.actions.executors import cluster, placeholders
from pingo.actions.executors.base import Reporter, Submission
from pingo.actions.executors.client import ClientProcessExecutor, find_program
from pingo.config import Settings


def spark_submit_command(
    spark_submit: str, master: str, deploy_mode: str, submission: Submission
) -> list[str]:
    """The spark-submit argv for one attempt of a Spark action."""
    action: Mapping[str, Any] = submission.definition
    output, inputs = submission.output_path, submission.inputs
    argv = [
        spark_submit,
        "--master", master,
        "--deploy-mode", deploy_mode,
        "--name", f"pingo-{submission.workflow_id}-{submission.action_id}",
    ]  # fmt: skip
    conf = {
        str(key): placeholders.resolve_argument(str(value), output, inputs)
        for key, value in sorted(action.get("conf", {}).items())
    }
    files, properties = cluster.shipped(action, output, inputs)
    conf.update(properties)
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    argv += cluster.file_options(files, spark=True)
    if action.get("mainClass"):
        argv += ["--class", str(action["mainClass"])]
    argv.append(placeholders.resolve_argument(str(action["application"]), output, inputs))
    argv += placeholders.resolve_argv([str(a) for a in action.get("arguments", [])], output, inputs)
    return argv


def wrapped_command(submission: Submission, command: list[str]) -> list[str]:
    """`command` run under the callback wrapper."""
    return [
        sys.executable, "-m", "pingo.actions.executors.spark_wrapper",
        "--callback-url", submission.callback_url,
        "--attempt", str(submission.attempt),
        "--token", submission.callback_token,
        "--", *command,
    ]  # fmt: skip


class SparkExecutor(ClientProcessExecutor):
    """Runs Spark applications with spark-submit under the callback wrapper."""

    def __init__(self, settings: Settings, reporter: Reporter) -> None:
        super().__init__(settings, reporter, "spark")
        self.spark_submit = find_program(settings.spark_submit_bin, "PINGO_SPARK_SUBMIT_BIN")

    def build_command(self, submission: Submission) -> list[str]:
        command = spark_submit_command(
            self.spark_submit,
            self.settings.spark_master,
            self.settings.spark_deploy_mode,
            submission,
        )
        return wrapped_command(submission, command)

    def kill_commands(self, jobs: cluster.ClusterJobs) -> list[tuple[list[str], str]]:
        """YARN applications as every cluster client's; standalone drivers by spark-submit."""
        commands = super().kill_commands(jobs)
        if self.settings.spark_deploy_mode == "cluster":
            master = self.settings.spark_master
            commands += [
                ([self.spark_submit, "--master", master, "--kill", driver], driver)
                for driver in jobs.driver_ids
            ]
        return commands

    def extra_environment(self) -> Mapping[str, str]:
        # PySpark applications run with this Python unless the operator chose another.
        return {} if "PYSPARK_PYTHON" in os.environ else {"PYSPARK_PYTHON": sys.executable}


def create(settings: Settings, reporter: Reporter) -> SparkExecutor:
    """Entry point for `spark` actions."""
    return SparkExecutor(settings, reporter)
