"""Shared fixtures: a real Mosquitto broker on a free loopback port, a real 3-node NATS
JetStream cluster, and no child process outliving its test.  The helpers themselves live
in tests/support."""

from __future__ import annotations

import ast
import functools
import multiprocessing.resource_tracker
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, Mosquitto, child_env, stop_leftover_processes
from tests.support.nats import NatsCluster
from tests.support.reaper import Reaper, become_subreaper
from tests.support.web import CHROMIUM, CHROMIUM_ARGS


def pytest_sessionstart(session):
    """Once, before pytest-xdist starts its workers (its own hook runs last): fill numba's
    cache (tests/support/warm.py) and compile the product's bytecode, so that on a fresh
    clone the workers and every agent and collector they start load them rather than all
    compiling them at once."""
    if hasattr(session.config, "workerinput"):  # a worker: the controller has done it
        return
    subprocess.run([sys.executable, "-m", "tests.support.warm"], cwd=REPO, env=child_env(),
                   check=True, timeout=600)
    # Likewise the bytecode of the product (the workers and every process a test starts
    # would otherwise all compile it at once), where bytecode is written at all.
    if not sys.dont_write_bytecode:
        subprocess.run([sys.executable, "-m", "compileall", "-q", "edge_agent", "collector"],
                       cwd=REPO, env=child_env(), check=False, timeout=600)


def pytest_configure(config):
    # In every test process (each xdist worker too): orphans of the processes a test
    # starts come back to it, for the fixture below to find (tests/support/reaper.py).
    become_subreaper()
    # multiprocessing's resource tracker serves the whole test process: started before
    # any test, so that the net below spares it.
    multiprocessing.resource_tracker.ensure_running()


# Modules of end-to-end tests that take 10-75 s each (brokers, fleets, clusters, demos),
# longest first (`make test` measures them: --durations).  They run first, so that
# parallel workers (pytest-xdist, handing out tests two at a time: make test) start
# them early and finish together, rather than one worker ending the run on a long one.
LONG_FIRST = ("tests/deploy/test_install_agent.py", "tests/collector/range/test_e2e_range.py",
              "tests/collector/scaleout/test_scale_out.py", "tests/collector/tools/test_demo.py",
              "tests/collector/scaleout/test_leases.py", "tests/collector/test_confirm.py",
              "tests/collector/test_hostile.py", "tests/collector/range/test_coordinator.py",
              "tests/collector/test_estimates_e2e.py", "tests/collector/test_e2e_collector.py",
              "tests/collector/tools/test_replay.py", "tests/collector/aggregation/test_limits.py",
              "tests/edge_agent/test_e2e_agent.py", "tests/collector/test_crashes.py")


# What makes a test end-to-end (``-m e2e``; make check runs the others): a real broker,
# cluster or browser among its fixtures, or a process it starts, itself, through a
# fixture or through a function of its module (these calls in their code).
E2E_FIXTURES = {"mosquitto", "nats_cluster", "browser", "postgres"}
E2E_CALLS = re.compile(r"\b(Mosquitto|SecureBroker|NatsCluster|AgentProcess|CollectorProcess|"
                       r"FleetProcess|run_module|python_module|replaying_agents|Popen|"
                       r"sync_playwright)\(|\bsubprocess\.")
CALL = re.compile(r"\b([A-Za-z_]\w*)\(")


@functools.cache
def functions_of(path: str) -> dict[str, tuple[bool, frozenset[str]]]:
    """Per function name of a test file (methods and nested ones too): whether its code
    starts something (E2E_CALLS), and the names it calls."""
    text = Path(path).read_text()
    lines = text.splitlines()
    found: dict[str, tuple[bool, frozenset[str]]] = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            code = "\n".join(lines[node.lineno - 1:node.end_lineno])
            starts, calls = found.get(node.name, (False, frozenset()))
            found[node.name] = (starts or bool(E2E_CALLS.search(code)),
                                calls | frozenset(CALL.findall(code)))
    return found


def starts_processes(path: str, names) -> bool:
    """Whether any of the functions ``names`` of the file at ``path``, or one they call
    there (transitively), starts a broker, a cluster, a browser or a process."""
    functions, seen, todo = functions_of(path), set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen or name not in functions:
            continue
        seen.add(name)
        starts, calls = functions[name]
        if starts:
            return True
        todo.extend(calls)
    return False


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if E2E_FIXTURES & fixtures or starts_processes(
                str(item.path), {getattr(item, "originalname", item.name), *fixtures}):
            item.add_marker(pytest.mark.e2e)
    rank = {module: i for i, module in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    """Kill any broker, agent or collector a test started and did not stop (it failed
    halfway, say), and whatever they started: they would hold ports and CPU for the
    rest of the run."""
    reaper = Reaper()
    yield
    stop_leftover_processes()
    left = reaper.collect()
    if left:  # shown with the test's output if it fails
        print("killed what the test left running:", *left, sep="\n  ")


@pytest.fixture
def mosquitto(tmp_path):
    broker = Mosquitto(tmp_path).start()
    yield broker
    broker.stop()


@pytest.fixture
def nats_cluster(tmp_path):
    cluster = NatsCluster(tmp_path / "nats").start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def browser():
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM}: run `make test` (it installs it with apt) "
                    "or set CHROMIUM")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()
