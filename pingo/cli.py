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


def main() -> None:
    """Entry point of the `pingo` console script."""
    app()
