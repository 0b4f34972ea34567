"""The submission sequence the simulator replays.

Families are ranked in a seeded random order and chosen with Zipf popularity
(the family of rank k with weight 1/k^s). The first submission of a family is
its trace as is; every later one perturbs the definition of one random action
of the family's current version (one more argument on its command line), so
that action and all its descendants get new provenance while the rest of the
workflow can be reused. Perturbations accumulate per family: a resubmission
starts from the previous version, as a team edits its pipeline step by step.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pingo.simulation.traces import Family, with_argument

#: Zipf exponent of family popularity.
ZIPF_EXPONENT = 1.1


@dataclass(frozen=True, slots=True)
class Submission:
    """One workflow submission of the sequence."""

    index: int
    family: str
    #: 0 for the family's first submission, then one more per perturbation.
    version: int
    document: Mapping[str, Any]
    #: The action whose definition this version changed (None for version 0).
    perturbed_action: int | None


def zipf_weights(count: int, exponent: float = ZIPF_EXPONENT) -> list[float]:
    """Normalized Zipf weights for ranks 1..count."""
    raw = [1.0 / (rank**exponent) for rank in range(1, count + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def generate(
    families: Sequence[Family],
    submissions: int,
    seed: int,
    *,
    exponent: float = ZIPF_EXPONENT,
) -> list[Submission]:
    """The seeded sequence of `submissions` submissions over `families`."""
    if not families:
        raise ValueError("no families to submit")
    rng = random.Random(seed)
    ranked = list(families)
    rng.shuffle(ranked)
    weights = zipf_weights(len(ranked), exponent)
    current: dict[str, Mapping[str, Any]] = {}
    versions: dict[str, int] = {}
    sequence: list[Submission] = []
    for index in range(submissions):
        family = rng.choices(ranked, weights=weights)[0]
        document = current.get(family.name)
        if document is None:
            document = family.document
            version, perturbed = 0, None
        else:
            version = versions[family.name] + 1
            actions = document["actions"]
            position = rng.randrange(len(actions))
            perturbed = int(actions[position]["id"])
            # Copy on write: the versions share every action they did not change.
            changed = with_argument(actions[position], f"--pingo-sim-perturbation={version}")
            document = {
                **document,
                "actions": [*actions[:position], changed, *actions[position + 1 :]],
            }
        current[family.name] = document
        versions[family.name] = version
        sequence.append(Submission(index, family.name, version, document, perturbed))
    return sequence
