"""The `pingo` command line. Logging is configured here and nowhere else."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from pingo import __version__
from pingo import client as pingo_client

app = typer.Typer(
    name="pingo",
    help="Pingo: a workflow server that reuses datasets by provenance.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def configure_logging(level: str = "INFO") -> None:
    """Log to stderr, one line per event."""
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pingo {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Pingo: a workflow server that reuses datasets by provenance."""


@app.command()
def server(
    host: str | None = typer.Option(None, help="Address to listen on [PINGO_HOST]."),
    port: int | None = typer.Option(None, help="Port to listen on [PINGO_PORT]."),
    home: str | None = typer.Option(None, help="Pingo's directory [PINGO_HOME]."),
    store_url: str | None = typer.Option(
        None, "--store-url", help="sqlite:///path or mongodb://host [PINGO_STORE_URL]."
    ),
    data_root: str | None = typer.Option(
        None, "--data-root", help="Where datasets live [PINGO_DATA_ROOT]."
    ),
    log_level: str | None = typer.Option(None, "--log-level", help="[PINGO_LOG_LEVEL]"),
) -> None:
    """Run the Pingo server (HTTP API and engine) until SIGINT or SIGTERM."""
    import asyncio
    import os
    from pathlib import Path

    from pingo import errors
    from pingo.api.app import serve
    from pingo.config import Settings, consume_secret_environment

    try:
        settings = Settings.from_env(
            host=host,
            port=port,
            home=Path(home) if home is not None else None,
            store_url=store_url,
            data_root=data_root,
            log_level=log_level,
        )
        consume_secret_environment()
        # Files the server creates ($PINGO_HOME's db, tokens, secret, logs) are its own only.
        os.umask(0o077)
        configure_logging(settings.log_level)
        # The HTTP API and the node's loops, in one process (issue 5).
        asyncio.run(serve(settings))
    except errors.PingoError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(1) from None


# ------------------------------------------------------------------------------------------
# Client commands (issue 5): they talk to a running server through `pingo.client.Client`,
# configured by PINGO_URL (or PINGO_HOST/PINGO_PORT) and PINGO_TOKEN (or the admin token file).

_WORKFLOW_DONE = ("FINISHED", "FAILED", "KILLED")


@contextlib.contextmanager
def _api_errors() -> Iterator[None]:
    """Turn client errors into a one-line message (and the issues) on stderr, exit status 1."""
    try:
        yield
    except pingo_client.ApiError as exc:
        typer.echo(f"error: {exc.describe()}", err=True)
        raise typer.Exit(1) from None
    except pingo_client.ClientError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except TimeoutError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        # Only the waiting stops: the workflow goes on running on the server.
        typer.echo("interrupted; the server carries on (see `pingo status ID`)", err=True)
        raise typer.Exit(130) from None


def _client() -> pingo_client.Client:
    return pingo_client.Client.from_env()


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))


def _workflow_line(document: Mapping[str, Any]) -> str:
    """`ID STATE: N actions, C computed, R reused` (plus failures)."""
    actions = document.get("actions", [])
    reused = sum(1 for a in actions if a["reused"])
    computed = sum(1 for a in actions if a["state"] == "FINISHED" and not a["reused"])
    parts = [f"{len(actions)} actions", f"{computed} computed", f"{reused} reused"]
    counts = document.get("counts", {})
    for state in ("FAILED", "KILLED"):
        if counts.get(state):
            parts.append(f"{counts[state]} {state.lower()}")
    return f"{document['id']} {document['state']}: {', '.join(parts)}"


def _done(document: Mapping[str, Any]) -> int:
    counts = document.get("counts", {})
    return sum(int(counts.get(state, 0)) for state in _WORKFLOW_DONE)


def _wait_with_progress(client: pingo_client.Client, document: dict[str, Any]) -> dict[str, Any]:
    """Poll the workflow to its end, with a live bar of finished/total actions on stderr."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    total = max(1, len(document.get("actions", [])))
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("actions"),
        TimeElapsedColumn(),
        console=console,
        transient=not console.is_terminal,
    ) as progress:
        task = progress.add_task(document["state"], total=total, completed=_done(document))

        def update(current: dict[str, Any]) -> None:
            progress.update(task, completed=_done(current), description=current["state"])

        return client.wait(document["id"], on_update=update)


def _report_failures(client: pingo_client.Client, document: Mapping[str, Any]) -> None:
    for action in document.get("actions", []):
        if action["state"] == "FAILED":
            detail = client.action(document["id"], action["actionId"])
            typer.echo(
                f"  action {action['actionId']} ({action['name']}) failed: "
                f"{detail.get('error') or 'no error text'}\n"
                f"    see: pingo logs {document['id']} {action['actionId']}",
                err=True,
            )


def _finish(
    client: pingo_client.Client, document: dict[str, Any], *, wait: bool, as_json: bool
) -> None:
    """Shared tail of `submit` and `rerun`: wait, print, exit 0 only on SUCCEEDED when waiting."""
    if not as_json:
        typer.echo(document["id"])
    if wait and document["state"] not in ("SUCCEEDED", "FAILED", "KILLED"):
        document = _wait_with_progress(client, document)
    if as_json:
        _print_json(document)
    elif wait or document["state"] != "RUNNING":
        typer.echo(_workflow_line(document))
    if document["state"] in ("FAILED", "KILLED"):
        _report_failures(client, document)
        raise typer.Exit(1)
    if wait and document["state"] != "SUCCEEDED":
        raise typer.Exit(1)


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="The workflow document (JSON); '-' reads stdin.")],
    wait: bool = typer.Option(False, "--wait", help="Wait for the end, with a progress bar."),
    as_json: bool = typer.Option(False, "--json", help="Print the workflow document as JSON."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; run nothing."),
    idempotency_key: str | None = typer.Option(
        None, "--idempotency-key", help="Retrying with the same key returns the same workflow."
    ),
) -> None:
    """Submit a workflow; print its id. With --wait, exit 0 only if it SUCCEEDED."""
    data = sys.stdin.buffer.read() if str(file) == "-" else _read_file(file)
    with _api_errors():
        client = _client()
        if dry_run:
            plan = client.submit(data, dry_run=True)
            if as_json:
                _print_json(plan)
            else:
                for action in plan["actions"]:
                    verdict = "compute" if action["compute"] else "skip"
                    typer.echo(
                        f"{action['actionId']:>6} {action['name']:<24} {verdict:<8} "
                        f"{action['reason']}"
                    )
                summary = plan["summary"]
                typer.echo(
                    f"{summary['compute']} to compute, {summary['reused']} reused, "
                    f"{summary['notNeeded']} not needed"
                )
            return
        document = client.submit(data, idempotency_key=idempotency_key)
        _finish(client, document, wait=wait, as_json=as_json)


def _read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        typer.echo(f"error: cannot read {path}: {exc.strerror or exc}", err=True)
        raise typer.Exit(2) from None


@app.command()
def status(
    workflow_id: str = typer.Argument(..., metavar="ID"),
    as_json: bool = typer.Option(False, "--json", help="Print the workflow document as JSON."),
) -> None:
    """Show a workflow and the state of each of its actions."""
    from rich.console import Console
    from rich.table import Table

    with _api_errors():
        document = _client().workflow(workflow_id)
    if as_json:
        _print_json(document)
        return
    typer.echo(_workflow_line(document))
    typer.echo(
        f"name: {document['name']}  owner: {document['owner']}  "
        f"created: {document['createdAt']}  finished: {document['finishedAt'] or '-'}"
    )
    table = Table("id", "name", "type", "state", "reused", "attempts", "dataset")
    for a in document["actions"]:
        table.add_row(
            str(a["actionId"]),
            a["name"],
            a["type"],
            a["state"],
            "yes" if a["reused"] else "",
            str(a["attempts"]),
            a["datasetId"][:12],
        )
    Console().print(table)


@app.command("list")
def list_workflows(
    state: str | None = typer.Option(None, "--state", help="Only workflows in this state."),
    name: str | None = typer.Option(None, "--name", help="Only workflows with this name."),
    limit: int = typer.Option(100, "--limit", min=1, max=1000, help="How many (newest first)."),
    as_json: bool = typer.Option(False, "--json", help="Print the page as JSON."),
) -> None:
    """List workflows, newest first."""
    with _api_errors():
        page = _client().workflows(state=state, name=name, limit=limit)
    if as_json:
        _print_json(page)
        return
    for w in page["items"]:
        typer.echo(f"{w['id']}  {w['state']:<9}  {w['createdAt']}  {w['owner']:<12}  {w['name']}")


@app.command()
def kill(workflow_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Kill a running workflow."""
    with _api_errors():
        document = _client().kill(workflow_id)
    typer.echo(_workflow_line(document))


@app.command()
def rerun(
    workflow_id: str = typer.Argument(..., metavar="ID"),
    force: Annotated[
        list[str] | None,
        typer.Option("--force", help="Recompute this action (name or id); repeatable."),
    ] = None,
    wait: bool = typer.Option(False, "--wait", help="Wait for the end, with a progress bar."),
    as_json: bool = typer.Option(False, "--json", help="Print the workflow document as JSON."),
) -> None:
    """Run a workflow's document again as a new workflow (stored datasets are reused)."""
    targets: list[str | int] = [int(f) if f.isdigit() else f for f in force or []]
    with _api_errors():
        client = _client()
        document = client.rerun(workflow_id, targets)
        _finish(client, document, wait=wait, as_json=as_json)


@app.command()
def logs(
    workflow_id: str = typer.Argument(..., metavar="ID"),
    action: str = typer.Argument(..., metavar="ACTION", help="The action's id or name."),
    attempt: int | None = typer.Option(None, "--attempt", min=1, help="Default: the latest."),
) -> None:
    """Print the log of an action (local executor)."""
    with _api_errors():
        client = _client()
        if action.isdigit():
            action_id = int(action)
        else:
            matches = [
                a["actionId"]
                for a in client.workflow(workflow_id)["actions"]
                if a["name"] == action
            ]
            if len(matches) != 1:
                found = "no action" if not matches else f"several actions ({matches})"
                typer.echo(f"error: {found} named {action!r}; give the action id", err=True)
                raise typer.Exit(1)
            action_id = matches[0]
        typer.echo(client.logs(workflow_id, action_id, attempt), nl=False)


datasets_app = typer.Typer(help="Inspect and delete datasets.", no_args_is_help=True)
app.add_typer(datasets_app, name="datasets")


@datasets_app.command("ls")
def datasets_ls(
    state: str | None = typer.Option(None, "--state", help="Only datasets in this state."),
    limit: int = typer.Option(100, "--limit", min=1, max=1000),
    as_json: bool = typer.Option(False, "--json", help="Print the page as JSON."),
) -> None:
    """List datasets, newest first."""
    with _api_errors():
        page = _client().datasets(state=state, limit=limit)
    if as_json:
        _print_json(page)
        return
    for d in page["items"]:
        size = "-" if d["sizeBytes"] is None else str(d["sizeBytes"])
        producer = f"{d['producedBy']['workflowId']}/{d['producedBy']['actionId']}"
        pinned = " pinned" if d["pinned"] else ""
        typer.echo(f"{d['id']}  {d['state']:<16} {size:>12}  {producer}{pinned}")


@app.command()
def storage(
    as_json: bool = typer.Option(False, "--json", help="Print the server's answer as JSON."),
) -> None:
    """Show the storage capacity, the bytes per dataset state and recent retention decisions."""
    with _api_errors():
        summary = _client().storage()
    if as_json:
        _print_json(summary)
        return
    for line in storage_lines(summary):
        typer.echo(line)


def storage_lines(summary: Mapping[str, Any]) -> list[str]:
    """`GET /storage` as plain lines (plain text: reasons are echoed, never rendered as markup)."""
    capacity = summary.get("capacityBytes")
    used = int(summary.get("usedBytes") or 0)
    share = f" ({used / capacity:.1%})" if capacity else ""
    lines = [
        f"capacity  {'unlimited' if capacity is None else f'{capacity:,} B'}",
        f"used      {used:,} B{share}",
        f"policy    {summary.get('policy')}",
        "bytes by state:",
    ]
    by_state: Mapping[str, int] = summary.get("bytesByState") or {}
    lines.extend(f"  {state:<18} {n:>16,} B" for state, n in by_state.items())
    decisions = summary.get("decisions") or []
    lines.append(f"recent decisions ({len(decisions)}):")
    lines.extend(
        f"  {d.get('at')}  {d.get('datasetId')}  {d.get('sizeBytes') or 0:,} B  "
        f"{d.get('policy')}: {d.get('reason')}"
        for d in decisions
    )
    return lines


@datasets_app.command("show")
def datasets_show(dataset_id: str = typer.Argument(..., metavar="DATASET")) -> None:
    """Show a dataset as JSON."""
    with _api_errors():
        _print_json(_client().dataset(dataset_id))


@datasets_app.command("rm")
def datasets_rm(
    dataset_id: str = typer.Argument(..., metavar="DATASET"),
    force: bool = typer.Option(False, "--force", help="Also delete a LEAF dataset."),
) -> None:
    """Mark a dataset for deletion (removed once no action still needs it)."""
    with _api_errors():
        dataset = _client().delete_dataset(dataset_id, force=force)
    typer.echo(f"{dataset['id']} {dataset['state']}")


@datasets_app.command("pin")
def datasets_pin(dataset_id: str = typer.Argument(..., metavar="DATASET")) -> None:
    """Pin a dataset: retention never evicts it."""
    with _api_errors():
        dataset = _client().pin(dataset_id, True)
    typer.echo(f"{dataset['id']} pinned")


@datasets_app.command("unpin")
def datasets_unpin(dataset_id: str = typer.Argument(..., metavar="DATASET")) -> None:
    """Unpin a dataset."""
    with _api_errors():
        dataset = _client().pin(dataset_id, False)
    typer.echo(f"{dataset['id']} unpinned")


@app.command()
def lineage(
    dataset_id: str = typer.Argument(..., metavar="DATASET"),
    as_json: bool = typer.Option(False, "--json", help="Print the graph as JSON."),
) -> None:
    """Show the ancestors of a dataset (parent -> child edges)."""
    with _api_errors():
        graph = _client().lineage(dataset_id)
    if as_json:
        _print_json(graph)
        return
    for node in graph["nodes"]:
        producer = ""
        if node.get("producerWorkflowId"):
            producer = f"  {node['producerWorkflowId']}/{node['producerActionId']}"
        typer.echo(f"{node['id']}  {node['state'] or 'UNKNOWN'}{producer}")
    for edge in graph["edges"]:
        typer.echo(f"{edge['from'][:12]} -> {edge['to'][:12]}")


users_app = typer.Typer(help="Manage users and their tokens (admin).", no_args_is_help=True)
app.add_typer(users_app, name="users")


@users_app.command("add")
def users_add(
    name: str = typer.Argument(...),
    admin: bool = typer.Option(False, "--admin", help="Make the user an admin."),
) -> None:
    """Create a user; its token is printed once, as the last line."""
    with _api_errors():
        user = _client().create_user(name, admin=admin)
    role = "admin" if user["admin"] else "user"
    typer.echo(f"created {role} {user['name']}; its token (shown once):")
    typer.echo(user["token"])


@users_app.command("list")
def users_list() -> None:
    """List users."""
    with _api_errors():
        users = _client().users()
    for user in users:
        typer.echo(
            f"{user['name']:<24} {'admin' if user['admin'] else 'user':<6} {user['createdAt']}"
        )


@users_app.command("revoke")
def users_revoke(name: str = typer.Argument(...)) -> None:
    """Delete a user; its token stops working at once."""
    with _api_errors():
        _client().delete_user(name)
    typer.echo(f"revoked {name}")


#: `pingo validate`'s files (a module-level default, as ruff's B008 asks).
_VALIDATE_FILES = typer.Argument(
    ..., metavar="FILE", help="Workflow documents (JSON); '-' reads stdin."
)


@app.command()
def validate(
    files: list[str] = _VALIDATE_FILES,
    as_json: bool = typer.Option(
        False, "--json", help='Print {"valid", "errors"} (a list of those for several files).'
    ),
    max_actions: int | None = typer.Option(
        None, "--max-actions", min=1, help="Limit on actions per workflow [PINGO_MAX_ACTIONS]."
    ),
) -> None:
    """Check workflow documents offline. Exit 0 if all are valid, 1 if any is not, 2 on
    usage errors (such as a file that cannot be read)."""
    import json as json_module
    import sys as sys_module

    from pingo import errors as pingo_errors
    from pingo.config import Settings
    from pingo.workflows import language

    try:
        limit = max_actions if max_actions is not None else Settings.from_env().max_actions
    except pingo_errors.PingoError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from None
    # Every file is read before any is judged: an unreadable one is a usage error.
    contents: list[bytes] = []
    unreadable = False
    for name in files:
        if name == "-":
            contents.append(sys_module.stdin.buffer.read())
            continue
        try:
            with open(name, "rb") as handle:
                contents.append(handle.read())
        except OSError as exc:
            typer.echo(f"error: cannot read {name}: {exc.strerror or exc}", err=True)
            unreadable = True
    if unreadable:
        raise typer.Exit(2)

    results = [
        (name, language.validate(content, max_actions=limit))
        for name, content in zip(files, contents, strict=True)
    ]
    if as_json:
        reports = [
            {"file": name, "valid": not issues, "errors": [i.to_json() for i in issues]}
            for name, issues in results
        ]
        if len(reports) == 1:
            del reports[0]["file"]
        shown = reports[0] if len(reports) == 1 else reports
        typer.echo(json_module.dumps(shown, indent=2, ensure_ascii=False))
    else:
        for name, issues in results:
            if not issues:
                typer.echo(f"{name}: OK")
                continue
            typer.echo(f"{name}: {len(issues)} error{'s' if len(issues) > 1 else ''}")
            for issue in issues:
                typer.echo(f"  {issue.code} {issue.pointer or '(document)'}: {issue.message}")
    if any(issues for _, issues in results):
        raise typer.Exit(1)


#: `pingo simulate`'s repeatable options (module-level defaults, as ruff's B008 asks).
_SIM_TRACES = typer.Option(
    None,
    "--trace",
    metavar="FILE",
    help="A workflow trace: a WfCommons instance (.json or .json.gz) or a document from "
    "make_workloads.py wfcommons. Repeat for several families [the seven WfCommons traces "
    "shipped with Pingo].",
)
_SIM_SEEDS = typer.Option(
    None, "--seed", help="Seed of the submission sequence; repeat to average over seeds [1]."
)
_SIM_POLICIES = typer.Option(
    None,
    "--policy",
    help="Retention policy to replay, with options as name:key=value; repeat "
    "(default: lru, lfu, cost-benefit, gdsf, most-used, adaptive, lineage).",
)
_SIM_CAPACITIES = typer.Option(
    None,
    "--capacity",
    help="Storage capacity as a fraction of the working set; repeat [0.05, 0.1, 0.2, 0.5].",
)
_SIM_PLOT = typer.Option(
    None,
    "--plot",
    metavar="FILE.svg",
    help="Write compute-vs-capacity curves (SVG), the lower bound drawn as the floor.",
)


@app.command()
def simulate(
    trace: list[Path] | None = _SIM_TRACES,
    submissions: int = typer.Option(200, "--submissions", min=1, help="Workflows submitted."),
    seed: list[int] | None = _SIM_SEEDS,
    policy: list[str] | None = _SIM_POLICIES,
    capacity: list[float] | None = _SIM_CAPACITIES,
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
    output_format: str = typer.Option(
        "table",
        "--format",
        help="table (two tables), json (every result), csv or markdown (one row per "
        "policy and capacity, mean over seeds).",
    ),
    plot: Path | None = _SIM_PLOT,
    jobs: int = typer.Option(1, "--jobs", min=1, help="Replays run in this many processes."),
    high_water: float = typer.Option(0.90, "--high-water", help="Retention's high water mark."),
    low_water: float = typer.Option(0.75, "--low-water", help="Retention's low water mark."),
) -> None:
    """Replay workflow traces through the real engine under storage budgets, per policy.

    Reports the compute executed per policy and capacity, next to no reuse, unlimited
    storage and an offline oracle that knows the future submissions.
    """
    import asyncio
    import json as json_module

    from rich.console import Console

    from pingo import errors as pingo_errors
    from pingo.retention import simulate as simulation
    from pingo.retention.traces import shipped_traces

    configure_logging("WARNING")
    err = Console(stderr=True)
    if as_json:
        output_format = "json"
    if output_format not in ("table", "json", "csv", "markdown"):
        typer.echo(
            f"error: --format must be table, json, csv or markdown, not {output_format!r}", err=True
        )
        raise typer.Exit(2)
    try:
        study = asyncio.run(
            simulation.study(
                trace or shipped_traces(),
                submissions=submissions,
                seeds=seed or [1],
                policies=policy or list(simulation.DEFAULT_POLICIES),
                capacities=capacity or list(simulation.DEFAULT_CAPACITIES),
                high_water=high_water,
                low_water=low_water,
                jobs=jobs,
                progress=lambda line: err.print(line, style="dim", highlight=False),
            )
        )
    except pingo_errors.PingoError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from None
    if all(s.working_set.reusable_bytes == 0 for s in study.seeds):
        err.print(
            "warning: no submission reuses another's dataset in this sequence, so every policy "
            "costs the same; give several traces or more submissions (resubmissions are reused)",
            style="yellow",
            highlight=False,
        )
    if plot is not None:
        simulation.plot(study.results, plot)
        err.print(f"wrote {plot}")
    if output_format == "json":
        typer.echo(json_module.dumps(study.to_json(), indent=2))
    elif output_format == "csv":
        typer.echo(simulation.csv_text(study.results), nl=False)
    elif output_format == "markdown":
        typer.echo(simulation.markdown(study.results))
    else:
        # Piped, rich would fit the tables to 80 columns and cut cells with "…".
        out = Console() if sys.stdout.isatty() else Console(width=400)
        for renderable in simulation.render(study):
            out.print(renderable)


def main() -> None:
    """Entry point of the `pingo` console script."""
    app()
