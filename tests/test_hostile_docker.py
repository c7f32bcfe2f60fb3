"""The hostile-agent suite (benchmarks/testing/hostile.py) through the Docker backends of LLB-OS and LLB-DB.

The same attacks as tests/test_hostile.py, each played as one episode of the real adapter on a
real Docker daemon: LLB-OS in a container per episode (`backend=docker`), LLB-DB on MariaDB in a
container (`server=docker`, a server of this module's own). Contained means what it means there
(a failure, nothing outside the container changed, another live episode's database unchanged,
the run goes on), and also that no container of the episode is left. Without a daemon these
tests skip with the reason, except under CI, where they fail (`test_bench_llb_docker.client`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import bench_data
import pytest
from test_bench_llb_docker import client  # noqa: F401  (client: the session's daemon fixture)
from test_hostile import agent, arena  # noqa: F401  (the same host canaries and scripted attacker)

from benchmarks.testing import hostile
from memrl_bench.environments.mysql import server as mysql_server
from memrl_bench.framework.protocol import Benchmark

TARGETS = ("llb-os:docker", "llb-db:docker")
# In the default suite: the check the agent cannot forge (its tools, its configuration, its shell from a
# program the check runs), and the two cross-episode attacks.
FAST = {"os-forged-check-tools", "os-nss-module-from-planted-config", "os-ptrace-the-check-from-its-tree",
        "db-read-another-episode", "db-destroy-another-episode"}


@pytest.fixture(scope="module")
def adapters(client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Benchmark]]:  # noqa: F811
    """The LLB adapters on the Docker backends, with an LLB-DB server of this module's own."""
    paths = bench_data.data_paths(tmp_path_factory.mktemp("hle"))
    with hostile.own_servers():
        made = {target: hostile.make_adapter(hostile.TARGETS[target][0], paths, hostile.TARGETS[target][1])
                for target in TARGETS}
        try:
            for bench in made.values():
                hostile.prepare(bench)
            assert mysql_server.running_server()["kind"] == "docker"  # type: ignore[index]
            yield made
        finally:
            for bench in made.values():
                bench.close()


@pytest.mark.parametrize("target,attack", [
    pytest.param(target, attack, id=f"{target}-{attack.name}",
                 marks=() if attack.name in FAST else pytest.mark.slow)
    for target in TARGETS for attack in hostile.ATTACKS if attack.benchmark == hostile.TARGETS[target][0]
])
def test_attack_is_contained_on_docker(target: str, attack: hostile.Attack, adapters, agent, arena) -> None:  # noqa: F811
    script, llm = agent
    outcome = hostile.run_attack(attack, adapters[target], llm, script, arena)
    assert outcome.contained, outcome.reason
    assert hostile.sandbox_containers() == []  # the episode's container is gone (run_attack checks it too)


@pytest.mark.parametrize("target", TARGETS)
def test_the_run_goes_on_after_the_attacks_on_docker(target: str, adapters, agent) -> None:  # noqa: F811
    script, llm = agent
    episode = hostile.honest_episode(adapters[target], llm, script)
    assert episode.success, (episode.status, episode.info)
