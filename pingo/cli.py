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


def main() -> None:
    """Entry point of the `pingo` console script."""
    app()
