"""One log record is one line: names users chose cannot split it or forge another."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from pingo import cli

#: A workflow name that, raw, would end the record and forge an admin-looking one.
FORGING = "a\n2026-01-01 00:00:00,000 INFO pingo.api.auth: created the first admin user\rb"
#: Unicode's bidirectional formatting characters: marks, embeddings, overrides, isolates.
BIDI = "\u200e\u200f\u061c\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def _record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("pingo.test", logging.INFO, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return record


def test_a_name_with_newlines_stays_on_one_line() -> None:
    line = cli.log_formatter().format(_record("submitted workflow %r", FORGING))
    assert len(line.splitlines()) == 1
    assert "\n" not in line and "\r" not in line
    # repr() already escapes inside %r; a %s name is the raw case.
    line = cli.log_formatter().format(_record("submitted workflow %s", FORGING))
    assert len(line.splitlines()) == 1
    assert "a\\n2026-01-01" in line and "user\\rb" in line


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [
        ("\x1b[2J", "\\x1b[2J"),
        ("\x00", "\\x00"),
        ("\t", "\\t"),
        ("\x7f", "\\x7f"),
        ("\x85", "\\x85"),
        ("\x9b31m", "\\x9b31m"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
        ("\x0b\x0c\x1c\x1d\x1e", "\\x0b\\x0c\\x1c\\x1d\\x1e"),
    ],
)
def test_control_characters_are_escaped(raw: str, escaped: str) -> None:
    line = cli.log_formatter().format(_record("name %s end", raw))
    assert f"name {escaped} end" in line
    assert len(line.splitlines()) == 1
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in line)


@pytest.mark.parametrize("control", BIDI)
def test_bidi_controls_are_escaped(control: str) -> None:
    # Raw, U+202E makes a viewer show the action "a<RLO>gnp.exe" as "aexe.png".
    line = cli.log_formatter().format(_record("action %s failed", f"a{control}gnp.exe"))
    assert f"action a\\u{ord(control):04x}gnp.exe failed" in line
    assert not set(BIDI) & set(line)


def test_a_traceback_escapes_bidi_controls_too() -> None:
    try:
        raise ValueError(f"bad name a{BIDI}gnp.exe")
    except ValueError:
        import sys

        record = logging.LogRecord(
            "pingo.test", logging.ERROR, __file__, 1, "failed %s", (BIDI,), sys.exc_info()
        )
    text = cli.log_formatter().format(record)
    assert not set(BIDI) & set(text)
    assert "  | ValueError: bad name a\\u200e\\u200f\\u061c\\u202a" in text


def test_extra_fields_a_format_names_are_escaped() -> None:
    formatter = cli.OneLineFormatter("%(message)s workflow=%(workflow)s")
    line = formatter.format(_record("done", workflow="x\ny"))
    assert line == "done workflow=x\\ny"


def test_a_traceback_is_indented_under_its_record_line() -> None:
    try:
        raise ValueError("bad name a\nb")
    except ValueError:
        import sys

        record = logging.LogRecord(
            "pingo.test", logging.ERROR, __file__, 1, "failed %s", ("w\nx",), sys.exc_info()
        )
    first, *traceback = cli.log_formatter().format(record).splitlines()
    assert first.endswith("failed w\\nx")
    # Readable line by line, and no line of it can pass for a record of its own.
    assert traceback[0] == "  | Traceback (most recent call last):"
    assert all(line.startswith("  | ") for line in traceback)
    assert "  | ValueError: bad name a" in traceback and "  | b" in traceback


@pytest.fixture
def root_logging() -> Iterator[io.StringIO]:
    """The root logger as `pingo server` configures it, writing to a buffer; restored after."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    root.handlers = []
    stream = io.StringIO()
    try:
        cli.configure_logging("INFO")
        for handler in root.handlers:
            assert isinstance(handler, logging.StreamHandler)
            handler.setStream(stream)
        yield stream
    finally:
        root.handlers = saved_handlers
        root.setLevel(saved_level)


def test_the_configured_server_log_writes_one_line_per_record(root_logging: io.StringIO) -> None:
    logging.getLogger("pingo.workflows").info(
        "workflow %s submitted", FORGING, extra={"event": "submitted", "workflow": FORGING}
    )
    text = root_logging.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n"), text
    assert "workflow a\\n2026-01-01 00:00:00,000 INFO" in text
    assert "\r" not in text
