"""The `pingo` command line. Logging is configured here and nowhere else."""

from __future__ import annotations

import codecs
import contextlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pingo import __version__, untrusted

if TYPE_CHECKING:
    # Imported where used: `pingo validate` must not pay for an HTTP client (cli_validate_s).
    from pingo import client as pingo_client

app = typer.Typer(
    name="pingo",
    help="Pingo: a workflow server that reuses datasets by provenance.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


#: The server log's line: every record is one line of this shape.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: What `OneLineFormatter` escapes: C0 controls (newlines, carriage returns, escape
#: sequences, tabs), DEL, C1 controls (NEL among them) and Unicode's line and paragraph
#: separators, the characters terminals and log readers act on or split lines at; and
#: the bidirectional controls (`untrusted.BIDI_ESCAPES`), which make a viewer show a
#: line's text out of order, as the web UI escapes them.
_LOG_ESCAPES: dict[int, str] = {
    **{c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))},
    0x09: "\\t",
    0x0A: "\\n",
    0x0D: "\\r",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
    **untrusted.BIDI_ESCAPES,
}


#: What a traceback's lines are indented with: no line of one starts like a record.
_TRACEBACK_INDENT = "  | "
#: The same escapes, but a traceback keeps its line breaks (indented instead).
_TRACEBACK_ESCAPES = {c: e for c, e in _LOG_ESCAPES.items() if c != 0x0A}


class OneLineFormatter(logging.Formatter):
    """A formatter whose records cannot be forged: a record's own line has its control
    characters escaped, and a traceback's lines are indented.

    Messages quote what users chose (workflow, action and user names, paths, keys):
    raw, a name holding "\\n" would end the record and start a forged one, and an
    escape sequence would drive the operator's terminal. A traceback stays readable,
    line by line, under its record; every line of it, the exception's message (which
    may quote a user's text) included, starts with `_TRACEBACK_INDENT`.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        return super().formatMessage(record).translate(_LOG_ESCAPES)

    def formatException(self, ei: Any) -> str:
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    """`text` escaped but for its line breaks, each line under `_TRACEBACK_INDENT`."""
    lines = text.translate(_TRACEBACK_ESCAPES).split("\n")
    return "\n".join(_TRACEBACK_INDENT + line for line in lines)


def log_formatter() -> logging.Formatter:
    """The formatter of the server's log (and of every command's)."""
    return OneLineFormatter(LOG_FORMAT)


def configure_logging(level: str = "INFO") -> None:
    """Log to stderr, one line per event (see `OneLineFormatter`)."""
    handler = logging.StreamHandler()
    handler.setFormatter(log_formatter())
    logging.basicConfig(level=level.upper(), handlers=[handler])


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

_WORKFLOW_DONE = ("FINISHED", "FAILED", "KILLED", "UPSTREAM_FAILED")


@contextlib.contextmanager
def _api_errors() -> Iterator[None]:
    """Turn client errors into a one-line message (and the issues) on stderr, exit status 1."""
    from pingo import client as pingo_client

    try:
        yield
    except pingo_client.ApiError as exc:
        typer.echo(f"error: {_shown(exc.describe())}", err=True)
        raise typer.Exit(1) from None
    except pingo_client.ClientError as exc:
        typer.echo(f"error: {_shown(str(exc))}", err=True)
        raise typer.Exit(1) from None
    except TimeoutError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        # Only the waiting stops: the workflow goes on running on the server.
        typer.echo("interrupted; the server carries on (see `pingo status ID`)", err=True)
        raise typer.Exit(130) from None


def _client() -> pingo_client.Client:
    from pingo import client as pingo_client

    return pingo_client.Client.from_env()


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))


#: `--json` of every command that lists or shows something.
_JSON = typer.Option(False, "--json", help="Print the server's answer as JSON.")


def _shown(text: str) -> str:
    """Untrusted text (names, problem details) as a terminal may show it: controls,
    escape sequences and bidirectional controls as escapes, as in the log
    (`_LOG_ESCAPES`). Another user's name must not move the cursor or reorder a line."""
    return text.translate(_LOG_ESCAPES)


def _print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Rows under headers, never cut.

    On a terminal, rich draws the table and folds a long cell onto more lines; piped
    (or redirected), plain space-aligned columns at full width, one row per line,
    for grep and awk. Cells are plain text: untrusted names are never read as markup,
    and their controls are shown as escapes (`_shown`).
    """
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        table = Table(*headers)
        for column in table.columns:
            column.overflow = "fold"
        for row in rows:
            table.add_row(*(Text(_shown(cell)) for cell in row))
        Console().print(table)
        return
    rows = [[_shown(cell) for cell in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]
    for line in (headers, *rows):
        typer.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


def reuse_cell(action: Mapping[str, Any]) -> str:
    """An action's reuse word; `shared with <workflow>/<action id> (<name>)` when it shares
    another workflow's computation (`shared with <name>` when that workflow is another user's)."""
    word = str(action.get("reuse", ""))
    view = action.get("sharedWith")
    if word != "shared" or not isinstance(view, Mapping):
        return word
    if view.get("workflowId"):
        return f"shared with {view['workflowId']}/{view.get('actionId')} ({view.get('name')})"
    return f"shared with {view.get('name')}"


def reuse_phrase(summary: Mapping[str, Any]) -> str:
    """`C computed, S shared, R reused, N not needed`: the one vocabulary of reuse."""
    return (
        f"{summary.get('computed', 0)} computed, {summary.get('shared', 0)} shared, "
        f"{summary.get('reused', 0)} reused, {summary.get('notNeeded', 0)} not needed"
    )


def _workflow_line(document: Mapping[str, Any]) -> str:
    """`ID STATE: N actions, C computed, S shared, R reused, N not needed` (plus failures)."""
    actions = document.get("actions", [])
    parts = [f"{len(actions)} actions", reuse_phrase(document.get("reuse") or {})]
    counts = document.get("counts", {})
    for state in ("FAILED", "KILLED", "UPSTREAM_FAILED"):
        if counts.get(state):
            parts.append(f"{counts[state]} {state.lower().replace('_', ' ')}")
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


def _report_failures(document: Mapping[str, Any]) -> None:
    for action in document.get("actions", []):
        if action["state"] == "FAILED":
            typer.echo(
                f"  action {action['actionId']} ({action['name']}) failed: "
                f"{action.get('error') or 'no error text'}\n"
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
        _report_failures(document)
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
                rows = [
                    [str(a["actionId"]), a["name"], reuse_cell(a), a["reason"], a["datasetId"]]
                    for a in plan["actions"]
                ]
                _print_table(["id", "name", "reuse", "reason", "dataset"], rows)
                typer.echo(f"plan: {reuse_phrase(plan['summary'])}")
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
    """Show a workflow, the state of each of its actions, and why any failed.

    ID may be a unique prefix of the id (8 characters or more)."""
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
    if document.get("error"):
        typer.echo(f"error: {document['error']}")
    # A terminal gets git-style short dataset ids (any 8+ characters are accepted back).
    width = 12 if sys.stdout.isatty() else None
    rows = [
        [
            str(a["actionId"]),
            a["name"],
            a["type"],
            a["state"],
            reuse_cell(a),
            str(a["attempts"]),
            a["datasetId"][:width],
        ]
        for a in document["actions"]
    ]
    _print_table(["id", "name", "type", "state", "reuse", "attempts", "dataset"], rows)
    for line in _action_errors(document):
        typer.echo(line)


def _action_errors(document: Mapping[str, Any]) -> list[str]:
    """One line per action that did not finish and says why (a retry's last error too)."""
    return [
        f"action {a['actionId']} ({a['name']}) {a['state']}: {a['error']}"
        for a in document.get("actions", [])
        if a.get("error") and a["state"] != "FINISHED"
    ]


_CURSOR = typer.Option(
    None, "--cursor", help="Start at this page: the `next` cursor an earlier page gave."
)
_ALL = typer.Option(False, "--all", help="Follow every page to the end.")


def _collect(
    fetch: Callable[[str | None], dict[str, Any]], cursor: str | None, every: bool
) -> dict[str, Any]:
    """One page from `cursor`, or with `every` all of them as one page (`next`: null)."""
    page = fetch(cursor)
    if not every:
        return page
    items = list(page["items"])
    while page.get("next"):
        page = fetch(page["next"])
        items.extend(page["items"])
    return {"items": items, "next": None}


def _page_footer(page: Mapping[str, Any], command: str, nothing: str) -> None:
    """On stderr: what an empty page means, or how to get the next one."""
    if not page["items"]:
        typer.echo(nothing, err=True)
    if page.get("next"):
        typer.echo(f"more: {command} --cursor {page['next']}  (or --all)", err=True)


@app.command("list")
def list_workflows(
    state: str | None = typer.Option(None, "--state", help="Only workflows in this state."),
    name: str | None = typer.Option(None, "--name", help="Only workflows with this name."),
    limit: int = typer.Option(100, "--limit", min=1, max=1000, help="How many per page."),
    cursor: str | None = _CURSOR,
    every: bool = _ALL,
    as_json: bool = _JSON,
) -> None:
    """List workflows, newest first, a page at a time."""
    with _api_errors():
        client = _client()
        page = _collect(
            lambda c: client.workflows(state=state, name=name, limit=limit, cursor=c),
            cursor,
            every,
        )
    if as_json:
        _print_json(page)
        return
    if page["items"]:
        rows = [[w["id"], w["state"], w["createdAt"], w["owner"], w["name"]] for w in page["items"]]
        _print_table(["id", "state", "created", "owner", "name"], rows)
    filtered = state is not None or name is not None or cursor is not None
    nothing = (
        "no workflow matches"
        if filtered
        else "no workflows yet: submit one with `pingo submit FILE` (try examples/)"
    )
    _page_footer(page, "pingo list", nothing)


@app.command()
def kill(workflow_id: str = typer.Argument(..., metavar="ID"), as_json: bool = _JSON) -> None:
    """Kill a running workflow."""
    with _api_errors():
        document = _client().kill(workflow_id)
    if as_json:
        _print_json(document)
        return
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
    tail: str | None = typer.Option(
        None, "--tail", metavar="SIZE", help="Only the log's last SIZE bytes (64KiB, 1000, …)."
    ),
    cluster: bool = typer.Option(
        True,
        "--cluster/--no-cluster",
        help="For MapReduce and Spark actions, also say where the cluster's logs are and "
        "fetch them with `yarn logs` when the YARN CLI is here ($PINGO_YARN_BIN or PATH).",
    ),
) -> None:
    """Print the log of an action: its process's (local executor) or its cluster client's,
    then where its cluster jobs' logs are."""
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
        _print_log(client.log_chunks(workflow_id, action_id, attempt, tail_bytes=_tail(tail)))
        if cluster:
            _cluster_logs(client.cluster_jobs(workflow_id, action_id, attempt))


_APPLICATION_ID = re.compile(r"application_[0-9]+_[0-9]+")


def _size(option: str, text: str, otherwise: str) -> int:
    """A size option's bytes (`500GB`, `2TiB`, `1000000`), or a usage error: `text` is
    `otherwise`."""
    from pingo import errors as pingo_errors
    from pingo.config import parse_size

    try:
        return parse_size(text)
    except pingo_errors.ConfigurationError as exc:
        raise typer.BadParameter(f"{text!r} is {otherwise}", param_hint=option) from exc


def _tail(text: str | None) -> int | None:
    """`--tail`'s size in bytes."""
    if text is None:
        return None
    size = _size("--tail", text, "not a size")
    if size < 1:
        raise typer.BadParameter("must be at least one byte", param_hint="--tail")
    return size


def _print_log(chunks: Iterator[bytes]) -> None:
    """Write a log as it arrives, never whole in memory: an action may write far more
    than this process can hold. A suffix range past an empty log (416) prints nothing."""
    from pingo import client as pingo_client

    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    try:
        for chunk in chunks:
            typer.echo(decoder.decode(chunk), nl=False)
    except pingo_client.ApiError as exc:
        if exc.status != 416:
            raise
    typer.echo(decoder.decode(b"", final=True), nl=False)


def _cluster_logs(jobs: Mapping[str, Any]) -> None:
    """Where an attempt's cluster jobs log, and their YARN logs when `yarn` is here."""
    if not (jobs["applications"] or jobs["drivers"] or jobs["urls"]):
        return
    typer.echo(f"\n--- cluster jobs of attempt {jobs['attempt']} ---")
    for url in jobs["urls"]:
        typer.echo(f"tracking / UI: {url}")
    for driver in jobs["drivers"]:
        typer.echo(f"Spark driver: {driver}")
    yarn = shutil.which(os.environ.get("PINGO_YARN_BIN") or "yarn")
    for application in jobs["applications"]:
        app = str(application["id"])
        if not _APPLICATION_ID.fullmatch(app):
            continue
        argv = ["yarn", "logs", "-applicationId", app]
        typer.echo(f"YARN application {app}: {' '.join(argv)}")
        if yarn is None:
            typer.echo("  (no YARN CLI here: run that command where one is)")
            continue
        # No shell, and the id is checked above: nothing from the log reaches a command line.
        fetched = subprocess.run(
            [yarn, *argv[1:]], capture_output=True, text=True, errors="replace", check=False
        )
        typer.echo(fetched.stdout, nl=False)
        if fetched.returncode != 0:
            typer.echo(f"  (yarn logs exited {fetched.returncode}: {fetched.stderr.strip()})")


datasets_app = typer.Typer(help="Inspect and delete datasets.", no_args_is_help=True)
app.add_typer(datasets_app, name="datasets")


@datasets_app.command("ls")
def datasets_ls(
    state: str | None = typer.Option(None, "--state", help="Only datasets in this state."),
    limit: int = typer.Option(100, "--limit", min=1, max=1000, help="How many per page."),
    cursor: str | None = _CURSOR,
    every: bool = _ALL,
    as_json: bool = _JSON,
) -> None:
    """List datasets, newest first; the size is what its files take now ("-": none)."""
    with _api_errors():
        client = _client()
        page = _collect(
            lambda c: client.datasets(state=state, limit=limit, cursor=c), cursor, every
        )
    if as_json:
        _print_json(page)
        return
    rows = [
        [
            d["id"],
            d["state"],
            "-" if d["sizeBytes"] is None else str(d["sizeBytes"]),
            _producer(d["producedBy"]),
            "pinned" if d["pinned"] else "",
        ]
        for d in page["items"]
    ]
    if rows:
        _print_table(["id", "state", "bytes", "produced by", "pinned"], rows)
    _page_footer(page, "pingo datasets ls", "no dataset" + (" matches" if state else "s yet"))


@app.command()
def storage(as_json: bool = _JSON) -> None:
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
        f"yours     {_yours(summary)}",
        "bytes by state:",
    ]
    by_state: Mapping[str, int] = summary.get("bytesByState") or {}
    lines.extend(f"  {state:<18} {n:>16,} B" for state, n in by_state.items())
    decisions = summary.get("decisions") or []
    lines.append(f"recent decisions ({len(decisions)}):")
    lines.extend(
        f"  {d.get('at')}  {d.get('kind') or 'evict':<7}  {d.get('datasetId')}  "
        f"{d.get('sizeBytes') or 0:,} B  {d.get('policy')}: {d.get('reason')}"
        for d in decisions
    )
    return lines


def _yours(summary: Mapping[str, Any]) -> str:
    """The caller's stored bytes against their quota, as `storage_lines` shows them."""
    own = int(summary.get("ownBytes") or 0)
    quota = summary.get("quotaBytes")
    if not quota:
        return f"{own:,} B (no quota)"
    return f"{own:,} B of a {quota:,} B quota ({own / quota:.1%})"


#: A dataset id, or a unique prefix of one (8+ characters), as `pingo status` prints it.
_DATASET = typer.Argument(..., metavar="DATASET", help="The id or a unique prefix (8+ chars).")


@datasets_app.command("show")
def datasets_show(
    dataset_id: str = _DATASET,
    as_json: bool = typer.Option(
        False, "--json", help="Accepted as everywhere: a dataset is shown as JSON anyway."
    ),
) -> None:
    """Show a dataset as JSON."""
    with _api_errors():
        _print_json(_client().dataset(dataset_id))


def _producer(produced_by: Mapping[str, Any]) -> str:
    """`workflow/action` when the server shows them (own datasets), else `type:name`."""
    if produced_by.get("workflowId"):
        return f"{produced_by['workflowId']}/{produced_by.get('actionId')}"
    return f"{produced_by.get('type')}:{produced_by.get('name') or '?'}"


@datasets_app.command("verify")
def datasets_verify(
    dataset_id: str | None = typer.Argument(None, metavar="[DATASET]"),
    every: bool = typer.Option(False, "--all", help="Verify every dataset on disk."),
    as_json: bool = typer.Option(False, "--json", help="Print each answer as JSON lines."),
) -> None:
    """Hash datasets' files again and compare with the digests recorded when they were stored.

    Exit status 1 when any dataset is mismatched or missing (it will be recomputed
    at its next reuse, never handed out).
    """
    if (dataset_id is None) == (not every):
        raise typer.BadParameter("give one DATASET or --all, not both")
    client = _client()
    bad = 0
    with _api_errors():
        if every:
            ids = [d["id"] for d in client.iter_datasets() if d["state"] in _ON_DISK]
        else:
            ids = [str(dataset_id)]
        for one in ids:
            answer = client.verify(one)
            verification = answer.get("verification") or {}
            status = str(verification.get("status"))
            bad += status in ("mismatch", "missing")
            if as_json:
                typer.echo(json.dumps(answer))
            else:
                found = verification.get("actualDigest") or "-"
                typer.echo(f"{one}  {status:<12}  {answer.get('digest') or '-'}  {found}")
    if bad:
        typer.echo(f"{bad} dataset(s) do not match their digest", err=True)
        raise typer.Exit(1)


#: Dataset states whose files are on disk (what `verify --all` checks).
_ON_DISK = frozenset({"STORED", "LEAF", "STORED_TO_DELETE"})


@datasets_app.command("rm")
def datasets_rm(
    dataset_id: str = _DATASET,
    force: bool = typer.Option(False, "--force", help="Also delete a LEAF dataset."),
    as_json: bool = _JSON,
) -> None:
    """Mark a dataset for deletion (removed once no action still needs it)."""
    with _api_errors():
        dataset = _client().delete_dataset(dataset_id, force=force)
    if as_json:
        _print_json(dataset)
        return
    typer.echo(f"{dataset['id']} {dataset['state']}")


@datasets_app.command("pin")
def datasets_pin(dataset_id: str = _DATASET, as_json: bool = _JSON) -> None:
    """Pin a dataset: retention never evicts it."""
    with _api_errors():
        dataset = _client().pin(dataset_id, True)
    if as_json:
        _print_json(dataset)
        return
    typer.echo(f"{dataset['id']} pinned")


@datasets_app.command("unpin")
def datasets_unpin(dataset_id: str = _DATASET, as_json: bool = _JSON) -> None:
    """Unpin a dataset."""
    with _api_errors():
        dataset = _client().pin(dataset_id, False)
    if as_json:
        _print_json(dataset)
        return
    typer.echo(f"{dataset['id']} unpinned")


@app.command()
def lineage(dataset_id: str = _DATASET, as_json: bool = _JSON) -> None:
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
        elif node.get("actionType"):
            producer = f"  {node['actionType']}:{node.get('actionName') or '?'}"
        digest = f"  {node['digest']}" if node.get("digest") else ""
        typer.echo(f"{node['id']}  {node['state'] or 'UNKNOWN'}{producer}{digest}")
    width = 12 if sys.stdout.isatty() else None
    for edge in graph["edges"]:
        typer.echo(f"{edge['from'][:width]} -> {edge['to'][:width]}")


users_app = typer.Typer(help="Manage users and their tokens (admin).", no_args_is_help=True)
app.add_typer(users_app, name="users")


@users_app.command("add")
def users_add(
    name: str = typer.Argument(...),
    admin: bool = typer.Option(False, "--admin", help="Make the user an admin."),
    reclaim: bool = typer.Option(
        False,
        "--reclaim",
        help="Give a revoked user's name back to the same person, with the workflows,"
        " schedules and events it still owns (refused otherwise).",
    ),
    as_json: bool = _JSON,
) -> None:
    """Create a user; its token is printed once, as the last line."""
    with _api_errors():
        user = _client().create_user(name, admin=admin, reclaim=reclaim)
    if as_json:
        _print_json(user)
        return
    role = "admin" if user["admin"] else "user"
    typer.echo(f"created {role} {user['name']}; its token (shown once):")
    typer.echo(user["token"])


@users_app.command("list")
def users_list(as_json: bool = _JSON) -> None:
    """List users."""
    with _api_errors():
        users = _client().users()
    if as_json:
        _print_json({"items": users})
        return
    rows = [[u["name"], "admin" if u["admin"] else "user", u["createdAt"]] for u in users]
    _print_table(["name", "role", "created"], rows)


@users_app.command("revoke")
def users_revoke(name: str = typer.Argument(...)) -> None:
    """Delete a user; its token stops working at once."""
    with _api_errors():
        _client().delete_user(name)
    typer.echo(f"revoked {name}")


#: `pingo users limits` options → the API's limit fields.
_LIMIT_OPTIONS = {
    "max_workflows": "maxWorkflows",
    "max_in_flight_actions": "maxInFlightActions",
    "submissions_per_minute": "submissionsPerMinute",
    "max_storage_bytes": "maxStorageBytes",
}
_LIMIT_HELP = "A positive integer, or 'default' for the server's."


def _limit_value(option: str, text: str) -> int | None:
    if text.strip().lower() == "default":
        return None
    if option == "--max-storage-bytes":
        return _size(option, text, "neither a size (200GiB, 5TB, 1000000) nor 'default'")
    try:
        return int(text)
    except ValueError as exc:
        raise typer.BadParameter(
            f"{text!r} is neither an integer nor 'default'", param_hint=option
        ) from exc


@users_app.command("limits")
def users_limits(
    name: str = typer.Argument(...),
    max_workflows: str | None = typer.Option(
        None, help=f"Workflows running at once. {_LIMIT_HELP}"
    ),
    max_in_flight_actions: str | None = typer.Option(
        None, help=f"Actions claimed or running at once (more wait READY). {_LIMIT_HELP}"
    ),
    submissions_per_minute: str | None = typer.Option(
        None, help=f"Workflow submissions a minute. {_LIMIT_HELP}"
    ),
    max_storage_bytes: str | None = typer.Option(
        None,
        help="Bytes of stored datasets the user's workflows may have produced before new "
        "workflows are refused: a size such as 200GiB, or 'default' for the server's.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the user as JSON."),
) -> None:
    """Show a user's limits; with options, change them (admin)."""
    given = {"max_workflows": max_workflows, "max_in_flight_actions": max_in_flight_actions,
             "submissions_per_minute": submissions_per_minute,
             "max_storage_bytes": max_storage_bytes}  # fmt: skip
    changes = {
        _LIMIT_OPTIONS[key]: _limit_value("--" + key.replace("_", "-"), text)
        for key, text in given.items()
        if text is not None
    }
    with _api_errors():
        user = _client().set_user_limits(name, changes) if changes else _client().user(name)
    if as_json:
        _print_json(user)
        return
    for key in _LIMIT_OPTIONS.values():
        value = user["limits"][key]
        source = "own" if user["ownLimits"][key] is not None else "server default"
        shown = "unlimited" if value is None else f"{value:,}"
        typer.echo(f"{key:<22} {shown:<18} ({source})")


schedules_app = typer.Typer(help="Recurring workflows (cron).", no_args_is_help=True)
app.add_typer(schedules_app, name="schedules")

#: `pingo schedules add`'s repeatable options (module-level defaults, as ruff's B008 asks).
_SCHEDULE_PARAMS = typer.Option(
    None, "--param", metavar="NAME=VALUE", help="A parameter for {param.NAME}; repeat."
)
_SCHEDULE_WORKFLOW = typer.Argument(
    None, metavar="WORKFLOW", help="The workflow document (JSON); '-' reads stdin."
)
_SCHEDULE_HOOKS = typer.Option(
    None,
    "--webhook",
    metavar="URL",
    help="Call URL when each run ends (signed with --webhook-secret); repeat.",
)


@schedules_app.command("add")
def schedules_add(
    name: str = typer.Argument(...),
    cron: str | None = typer.Argument(
        None, help="5 fields, or 6 with the seconds first; quote it (or a --when-* trigger)."
    ),
    file: Path | None = _SCHEDULE_WORKFLOW,
    when_stored: tuple[str, str] | None = typer.Option(
        None,
        "--when-stored",
        metavar="WORKFLOW ACTION",
        help="Instead of a cron: run each time your workflow's action stores its dataset.",
    ),
    when_appears: str | None = typer.Option(
        None,
        "--when-appears",
        metavar="PATH",
        help="Instead of a cron: run when PATH (relative to the data root) appears or changes.",
    ),
    timezone: str = typer.Option("UTC", "--timezone", "--tz", help="An IANA zone name."),
    catch_up: str = typer.Option("latest", "--catch-up", help="none, latest or all."),
    catch_up_limit: int = typer.Option(100, "--catch-up-limit", min=1, max=1000),
    max_concurrent: int | None = typer.Option(None, "--max-concurrent", min=1, max=50),
    overlap: str = typer.Option("skip", "--overlap", help="skip or queue (maxConcurrent)."),
    start: str | None = typer.Option(None, "--start", help="ISO 8601; no tick before."),
    end: str | None = typer.Option(None, "--end", help="ISO 8601; no tick after."),
    param: list[str] | None = _SCHEDULE_PARAMS,
    webhook: list[str] | None = _SCHEDULE_HOOKS,
    webhook_secret: str | None = typer.Option(
        None, "--webhook-secret", envvar="PINGO_WEBHOOK_SECRET", help="Signs --webhook calls."
    ),
    paused: bool = typer.Option(False, "--paused", help="Create it paused."),
) -> None:
    """Create a schedule (NAME CRON WORKFLOW, or NAME WORKFLOW --when-…); prints its id and
    next fire times."""
    if file is None:
        # With a trigger there is no CRON: the second argument is the workflow.
        if cron is None:
            typer.echo("error: missing the WORKFLOW document", err=True)
            raise typer.Exit(2)
        file, cron = Path(cron), None
    try:
        workflow = json.loads(_read_file(file))
    except ValueError as exc:
        typer.echo(f"error: {file} is not JSON: {exc}", err=True)
        raise typer.Exit(2) from None
    parameters: dict[str, str] = {}
    for item in param or []:
        key, sep, value = item.partition("=")
        if not sep:
            typer.echo(f"error: --param wants NAME=VALUE, not {item!r}", err=True)
            raise typer.Exit(2)
        parameters[key] = value
    if webhook and not webhook_secret:
        typer.echo("error: --webhook needs --webhook-secret", err=True)
        raise typer.Exit(2)
    firing = _schedule_firing(cron, when_stored, when_appears)
    body: dict[str, Any] = {
        "name": name,
        **firing,
        "timezone": timezone,
        "workflow": workflow,
        "catchUp": catch_up,
        "catchUpLimit": catch_up_limit,
        "maxConcurrent": max_concurrent,
        "overlap": overlap,
        "parameters": parameters,
        "webhooks": [{"url": url, "secret": webhook_secret} for url in webhook or []],
        "paused": paused,
    }
    body.update({k: v for k, v in (("start", start), ("end", end)) if v is not None})
    with _api_errors():
        schedule = _client().create_schedule(body)
    typer.echo(schedule["id"])
    for at in schedule["nextFireTimes"]:
        typer.echo(f"  next {at}")


def _schedule_firing(
    cron: str | None, when_stored: tuple[str, str] | None, when_appears: str | None
) -> dict[str, Any]:
    """`{"cron"}` or `{"trigger"}`: exactly one of the three ways to fire must be given."""
    given = [g for g in (cron, when_stored, when_appears) if g is not None]
    if len(given) != 1:
        typer.echo("error: give a CRON, --when-stored or --when-appears (one of them)", err=True)
        raise typer.Exit(2)
    if when_stored is not None:
        workflow, action = when_stored
        return {"trigger": {"dataset": {"workflow": workflow, "action": action}}}
    if when_appears is not None:
        return {"trigger": {"path": when_appears}}
    return {"cron": cron}


def _firing_text(schedule: Mapping[str, Any]) -> str:
    """How a schedule fires, for `pingo schedules list`."""
    trigger = schedule.get("trigger")
    if isinstance(trigger, Mapping) and isinstance(trigger.get("dataset"), Mapping):
        watched = trigger["dataset"]
        return f"stored {watched.get('workflow')}/{watched.get('action')}"
    if isinstance(trigger, Mapping) and "path" in trigger:
        return f"appears {trigger['path']}"
    return str(schedule.get("cron"))


@schedules_app.command("list")
def schedules_list(
    as_json: bool = typer.Option(False, "--json", help="Print the schedules as JSON."),
) -> None:
    """List your schedules with their next fire time."""
    with _api_errors():
        found = _client().schedules()
    if as_json:
        _print_json(found)
        return
    for s in found:
        if s["paused"]:
            next_at = "paused"
        elif s.get("trigger"):
            next_at = "on data"
        else:
            next_at = s["nextFireAt"] or "ended"
        firing = _firing_text(s)
        typer.echo(f"{s['id']}  {s['name']:<20} {firing:<20} {s['timezone']:<16} {next_at}")


@schedules_app.command("show")
def schedules_show(
    schedule_id: str = typer.Argument(..., metavar="SCHEDULE"),
    runs: int = typer.Option(10, "--runs", min=0, max=1000, help="How many recent runs."),
) -> None:
    """Show a schedule as JSON, with its next fire times and recent runs."""
    with _api_errors():
        client = _client()
        schedule = client.schedule(schedule_id)
        schedule["runs"] = client.schedule_runs(schedule_id, limit=runs) if runs else []
    _print_json(schedule)


@schedules_app.command("pause")
def schedules_pause(schedule_id: str = typer.Argument(..., metavar="SCHEDULE")) -> None:
    """Pause a schedule: no tick fires until it is resumed."""
    with _api_errors():
        schedule = _client().set_schedule_paused(schedule_id, True)
    typer.echo(f"{schedule['id']} paused")


@schedules_app.command("resume")
def schedules_resume(schedule_id: str = typer.Argument(..., metavar="SCHEDULE")) -> None:
    """Resume a schedule from its next tick (ticks due while paused are not caught up)."""
    with _api_errors():
        schedule = _client().set_schedule_paused(schedule_id, False)
    typer.echo(f"{schedule['id']} resumed; next {schedule['nextFireAt']}")


@schedules_app.command("rm")
def schedules_rm(schedule_id: str = typer.Argument(..., metavar="SCHEDULE")) -> None:
    """Delete a schedule (the workflows it ran stay)."""
    with _api_errors():
        _client().delete_schedule(schedule_id)
    typer.echo(f"deleted {schedule_id}")


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
    low_water: float = typer.Option(
        0.75, "--low-water", help="Retention's low water mark: the furthest one pass evicts to."
    ),
) -> None:
    """Replay workflow traces through the real engine under storage budgets, per policy.

    Reports the compute executed per policy and capacity, next to no reuse, unlimited
    storage and an offline oracle that knows the future submissions.
    """
    import asyncio
    import json as json_module

    from rich.console import Console

    from pingo import errors as pingo_errors
    from pingo.simulation import simulate as simulation
    from pingo.simulation.traces import shipped_traces

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
