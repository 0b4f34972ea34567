"""Every input that once broke the server, replayed over HTTP (tests/fixtures/fuzz_corpus.json).

Each case once got a 500 or a status the OpenAPI document did not declare. It
must now get the declared problem+json (or success), and the answer must be one
the OpenAPI document lists for that operation.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from yarl import URL

from pingo.api import openapi

from .conftest import Api, chain

CORPUS_FILE = Path(__file__).resolve().parents[1] / "fixtures" / "fuzz_corpus.json"
CASES: list[dict[str, Any]] = json.loads(CORPUS_FILE.read_text(encoding="utf-8"))["cases"]


async def _raw_request(
    api: Api, method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, str, bytes]:
    """Send bytes no HTTP client would (header values are written as latin-1: any byte)."""
    server = api.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {server.host}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    head, _, payload = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    content_type = next(
        (h.split(":", 1)[1].strip() for h in header_lines if h.lower().startswith("content-type")),
        "",
    )
    return int(status_line.split()[1]), content_type.split(";")[0], payload


def _declared(method: str, path: str, status: int) -> bool:
    """Whether the OpenAPI document lists `status` for the operation serving `path`."""
    route = URL(path).path
    for template, operations in openapi.document()["paths"].items():
        parts, wanted = template.split("/"), route.split("/")
        if len(parts) == len(wanted) and all(
            p == w or p.startswith("{") for p, w in zip(parts, wanted, strict=True)
        ):
            operation = operations.get(method.lower())
            if operation is not None:
                return str(status) in operation["responses"]
    raise AssertionError(f"no OpenAPI operation for {method} {path}")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
async def test_corpus_case(api: Api, case: dict[str, Any]) -> None:
    path = case["path"]
    if "{workflow}" in path or "{dataset}" in path:
        submitted = await api.submit(chain(case["name"], n=1))
        await api.wait(submitted["id"])
        datasets = await api.client.get("/api/v1/datasets", headers=api.auth("admin"))
        dataset = (await datasets.json())["items"][0]["id"]
        path = path.replace("{workflow}", submitted["id"]).replace("{dataset}", dataset)
    headers = dict(case["headers"])
    if case["auth"] is not None:
        headers.update(api.auth(case["auth"]))
    body = case["body"].encode("utf-8") if "body" in case else b""
    if body:
        headers["Content-Type"] = "application/json"
    status, content_type, payload = await _raw_request(api, case["method"], path, headers, body)

    assert status == case["status"], payload
    assert status < 500
    assert _declared(case["method"], path, status), f"{status} is not declared for {path}"
    if case["code"] is None:
        return
    assert content_type == "application/problem+json"
    problem = json.loads(payload)
    assert problem["code"] == case["code"], problem
    assert problem["status"] == status
    if case["pointer"] is not None:
        assert case["pointer"] in {e["pointer"] for e in problem["errors"]}, problem
