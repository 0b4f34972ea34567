"""Argv placeholders (`{output}`, `{input:<parentId>}`, `{inputs}`, `{inputs:sh}`) and
their env twins."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence

_INPUT = re.compile(r"\{input:(\d+)\}")
#: Every input path, each quoted for a POSIX shell, separated by spaces (for `sh -c`).
INPUTS_SH = "{inputs:sh}"


def shell_words(paths: Sequence[str]) -> str:
    """`paths` as shell words: `'a b' 'c'` (what `{inputs:sh}` and PINGO_INPUTS_SH hold)."""
    return " ".join(shlex.quote(p) for p in paths)


class PlaceholderError(ValueError):
    """An argument names an input the action does not have."""


def resolve_argument(arg: str, output: str, inputs: Mapping[int, str]) -> str:
    """Substitute `{output}` and `{input:<parentId>}` inside one argument."""

    def _input(match: re.Match[str]) -> str:
        parent = int(match.group(1))
        try:
            return inputs[parent]
        except KeyError:
            raise PlaceholderError(
                f"{match.group(0)} names action {parent}, which is not a parent of this action"
            ) from None

    return _INPUT.sub(_input, arg.replace("{output}", output))


def resolve_argv(argv: Sequence[str], output: str, inputs: Mapping[int, str]) -> list[str]:
    """Resolve every argument; a whole `{inputs}` argument expands to every input path.

    Inside a longer argument, `{inputs}` becomes the paths joined by commas (the
    form Hadoop and Spark take for several input paths), and `{inputs:sh}` the paths
    as shell words, each quoted, separated by spaces (for a `sh -c` script).
    """
    ordered = [inputs[k] for k in sorted(inputs)]
    resolved: list[str] = []
    for arg in argv:
        if arg == "{inputs}":
            resolved.extend(ordered)
            continue
        # {inputs:sh} first: "{inputs}" is not a substring of it, but keep the order obvious.
        arg = arg.replace(INPUTS_SH, shell_words(ordered)).replace("{inputs}", ",".join(ordered))
        resolved.append(resolve_argument(arg, output, inputs))
    return resolved


def environment(
    output: str, inputs: Mapping[int, str], workflow_id: str, action_id: int
) -> dict[str, str]:
    """PINGO_OUTPUT, PINGO_INPUT_<id>, PINGO_INPUTS (JSON), PINGO_INPUTS_SH (shell words),
    PINGO_WORKFLOW_ID, PINGO_ACTION_ID."""
    env = {
        "PINGO_OUTPUT": output,
        "PINGO_INPUTS": json.dumps({str(k): v for k, v in sorted(inputs.items())}),
        "PINGO_INPUTS_SH": shell_words([v for _, v in sorted(inputs.items())]),
        "PINGO_WORKFLOW_ID": workflow_id,
        "PINGO_ACTION_ID": str(action_id),
    }
    env.update({f"PINGO_INPUT_{k}": v for k, v in inputs.items()})
    return env
