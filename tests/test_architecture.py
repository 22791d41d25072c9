"""The shape of the code: no import cycles, no private names across modules, one MQTT
client constructor, and the wire protocol validated in one module only."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import REPO

PACKAGES = ("edge_agent", "collector")


def project_modules() -> dict[str, Path]:
    """Every module of the product by dotted name (packages by their __init__)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


MODULES = project_modules()


def _package_of(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def imports(module: str) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import statement of
    ``module``, also those inside functions; relative imports resolved."""
    tree = ast.parse(MODULES[module].read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package_of(module).split(".")
                package = package[:len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            found += [(base, alias.name, node.lineno) for alias in node.names]
    return found


def edges(module: str) -> set[str]:
    """The project modules importing ``module`` runs (a submodule runs its packages)."""
    out = set()
    for target, name, _ in imports(module):
        if name is not None and f"{target}.{name}" in MODULES:
            target = f"{target}.{name}"
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in MODULES and prefix != module and not module.startswith(prefix + "."):
                out.add(prefix)
    return out


def test_the_module_list_is_the_product():
    assert {"edge_agent.agent", "edge_agent.protocol.reports", "collector.service",
            "collector.aggregation.ingest"} <= set(MODULES)


def test_no_import_cycles():
    graph = {module: edges(module) for module in MODULES}
    cycles, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_imports_another_modules_private_names():
    offences = []
    for module in MODULES:
        for target, name, line in imports(module):
            if not target.startswith(PACKAGES):
                continue
            where = f"{MODULES[module].relative_to(REPO)}:{line}"
            # A private module (``_kernels``) belongs to its package.
            dotted = target.split(".") + ([name] if name else [])
            for i, part in enumerate(dotted):
                owner = ".".join(dotted[:i])
                if _private(part) and not (module == owner or module.startswith(owner + ".")):
                    offences.append(f"{where} imports {'.'.join(dotted)}")
                    break
            else:
                if name is not None and _private(name) and f"{target}.{name}" not in MODULES:
                    offences.append(f"{where} imports {name} from {target}")
    assert offences == []


def _calls(path: Path, names: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called in names:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_one_mqtt_client_constructor():
    """paho's Client is built in edge_agent/common/mqtt_client.py only (TLS, credentials,
    sessions, back-off and connection logging in one place)."""
    built = [call for module, path in MODULES.items() if module != "edge_agent.common.mqtt_client"
             for call in _calls(path, {"Client"})]
    assert built == []


# Inputs a user hands the agent (files, standard input, a local broker of raw readings)
# and HTTP documents the collector's own tools fetch are not the wire protocol.
LOCAL_INPUTS = {"edge_agent.sources.jsonl", "edge_agent.sources.mqtt_source",
                "edge_agent.sources.http.batches",
                "collector.tools.watch", "collector.tools.demo", "collector.cli",
                "collector.tools.replay", "collector.tools.export"}


# The typed formats: agent <-> collector messages, and the states collectors save and
# exchange (checkpoints, scale-out partition states).
TYPED_FORMATS = ("edge_agent.protocol", "collector.storage.states")


def test_wire_messages_are_decoded_in_the_protocol_module_only():
    """Every message from the network goes through a typed decoder of
    edge_agent/protocol (or, for a collector's state, collector/storage/states.py): no
    other module parses JSON by hand or decodes with msgspec."""
    found = []
    for module, path in MODULES.items():
        if module.startswith(TYPED_FORMATS) or module in LOCAL_INPUTS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            call = ast.unparse(node.func)
            if call in ("json.loads", "orjson.loads", "msgspec.json.decode",
                        "msgspec.json.Decoder"):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {call}")
    assert found == []


# The collector's web stack; the agent runs on a Raspberry Pi and needs none of it,
# but for the http source's server, which only an http source imports when it starts
# (tests/edge_agent/sources/test_http_source.py checks that the agent without one loads none of it).
SERVER_PACKAGES = ("starlette", "uvicorn", "sse_starlette", "prometheus_client", "h11")
HTTP_SOURCE_SERVER = "edge_agent.sources.http.server"
# uvicorn in a thread, shared by the collector's web server and the http source's.
SERVER_THREAD = "edge_agent.common.asgi"


def test_the_agent_imports_no_server_stack():
    found = [f"{MODULES[module].relative_to(REPO)}:{line} imports {target}"
             for module in MODULES if module.startswith("edge_agent")
             and module not in (HTTP_SOURCE_SERVER, SERVER_THREAD)
             for target, _, line in imports(module)
             if target.split(".")[0] in SERVER_PACKAGES or target == SERVER_THREAD]
    assert found == []


def test_the_http_sources_server_is_imported_inside_a_function_only():
    """No module imports it at its top level: only ``HttpSource.start`` does."""
    found = []
    for path in MODULES.values():
        for node in ast.parse(path.read_text()).body:  # top-level statements only
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                named = [alias.name for alias in node.names]
                if isinstance(node, ast.ImportFrom):
                    named.append(node.module or "")
                if any(name == HTTP_SOURCE_SERVER or f"{name}.server" == HTTP_SOURCE_SERVER
                       for name in named):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []


# -- the layers (docs/guides/ARCHITECTURE.md) -----------------------------------------------------

def _product_imports(module: str) -> list[tuple[str, int]]:
    """(imported module, line) of every import of ``module`` (top-level or not)."""
    return [(f"{target}.{name}" if name and f"{target}.{name}" in MODULES else target, line)
            for target, name, line in imports(module)]


def _offences(modules, allowed) -> list[str]:
    """Imports of project modules by ``modules`` that ``allowed(module, target)`` refuses."""
    return [f"{MODULES[module].relative_to(REPO)}:{line} imports {target}"
            for module in modules for target, line in _product_imports(module)
            if target.split(".")[0] in PACKAGES and not allowed(module, target)]


def _under(module: str, *packages: str) -> bool:
    return any(module == package or module.startswith(package + ".") for package in packages)


# What does I/O, or waits for it: the math imports none of it.
# (ssl is not one: the noise is drawn from OpenSSL's RAND_bytes, mechanisms/randomness.py.)
IO_MODULES = ("socket", "sqlite3", "paho", "nats", "starlette", "uvicorn", "h11",
              "sse_starlette", "prometheus_client", "threading", "asyncio", "multiprocessing",
              "subprocess", "urllib", "http", "selectors", "bleak", "smbus2")
PURE_MATH = ("edge_agent.mechanisms", "collector.estimation")


def test_the_math_does_no_io():
    found = [f"{MODULES[module].relative_to(REPO)}:{line} imports {target}"
             for module in MODULES if _under(module, *PURE_MATH)
             for target, _, line in imports(module) if target.split(".")[0] in IO_MODULES]
    assert found == []


def test_mechanisms_import_only_mechanisms():
    assert _offences([m for m in MODULES if _under(m, "edge_agent.mechanisms")],
                     lambda module, target: _under(target, "edge_agent.mechanisms")) == []


def test_the_protocol_imports_nothing_of_the_agent_program():
    """The protocol is both programs' (agent <-> collector messages): it stands on the
    mechanisms only."""
    assert _offences([m for m in MODULES if _under(m, "edge_agent.protocol")],
                     lambda module, target: _under(target, "edge_agent.protocol",
                                                   "edge_agent.mechanisms")) == []


def test_what_both_programs_run_stands_below_the_agent_program():
    assert _offences([m for m in MODULES if _under(m, "edge_agent.common")],
                     lambda module, target: _under(target, "edge_agent.common",
                                                   "edge_agent.protocol",
                                                   "edge_agent.mechanisms")) == []


def test_the_agent_never_imports_collector_code():
    assert _offences([m for m in MODULES if _under(m, "edge_agent")],
                     lambda module, target: not _under(target, "collector")) == []


def test_the_collector_uses_the_shared_layers_of_edge_agent_only():
    """mechanisms, protocol and common: never the agent program, its config or sources."""
    assert _offences([m for m in MODULES if _under(m, "collector")],
                     lambda module, target: not _under(target, "edge_agent") or _under(
                         target, "edge_agent.mechanisms", "edge_agent.protocol",
                         "edge_agent.common")) == []


def test_every_package_says_what_it_holds():
    """Each folder of the product is a package with a docstring (the tree in
    docs/guides/ARCHITECTURE.md)."""
    missing = [str(path.relative_to(REPO)) for package in PACKAGES
               for path in sorted((REPO / package).rglob("*"))
               if path.is_dir() and any(path.glob("*.py"))
               and not ast.get_docstring(ast.parse((path / "__init__.py").read_text()))
               if (path / "__init__.py").exists()] + \
              [str(path.relative_to(REPO)) for package in PACKAGES
               for path in sorted((REPO / package).rglob("*"))
               if path.is_dir() and any(path.glob("*.py")) and not (path / "__init__.py").exists()]
    assert missing == []
