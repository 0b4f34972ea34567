"""The `pingo` command line. Logging is configured here and nowhere else."""

from __future__ import annotations

import logging

import typer

from pingo import __version__

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
    """Run a Pingo node until SIGINT or SIGTERM."""
    import asyncio
    from pathlib import Path

    from pingo.config import Settings
    from pingo.node import run_node

    settings = Settings.from_env(
        host=host,
        port=port,
        home=Path(home) if home is not None else None,
        store_url=store_url,
        data_root=data_root,
        log_level=log_level,
    )
    configure_logging(settings.log_level)
    asyncio.run(run_node(settings))


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


def main() -> None:
    """Entry point of the `pingo` console script."""
    app()
