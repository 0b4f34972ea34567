"""The benchmarks' workflows compute every action, whatever the identity rules.

A figure per action (`noop_actions_per_s`, `true_makespan_s` against 1,000 spawns, Luigi's
1,000 tasks) counts computations. The shared workloads run `true` everywhere, so before
`_workloads.computing` their 1,000 layered actions were 20 datasets and Montage's 1,738
were 9: most actions shared another's computation instead of running.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench import _workloads
from pingo.workflows import language, provenance


@pytest.mark.parametrize("workload", [_workloads.layered_1000, _workloads.montage])
def test_each_action_of_a_benchmark_workflow_has_a_provenance_of_its_own(
    workload: Callable[[], _workloads.Document],
) -> None:
    definition = language.parse(workload())
    ids = provenance.dataset_ids(definition, "shared")
    assert len(set(ids.values())) == len(definition.actions)


def test_the_shipped_layered_workload_alone_would_share_its_roots() -> None:
    # What `computing` is for: the committed file's 50 roots are one provenance.
    definition = language.parse(_workloads._load_json(_workloads.LAYERED_1000))
    ids = provenance.dataset_ids(definition, "shared")
    assert len(set(ids.values())) < len(definition.actions)
