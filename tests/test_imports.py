"""The package layout holds: imports run one way (contract <- runtime <- gemma4_port) and no module
imports itself back through others. Read from the source (lazy imports inside functions count)."""

from __future__ import annotations

import ast
from pathlib import Path

from support import ROOT
from support.sources import project_modules

# What the build package may take from the server: the load path verify shares with it, the rank group
# the CPU tensor-parallel compile traces its ranks in (the server runs them in the same one), and the probe
# of the installed Neuron SDK (the compile and doctor ask what the server asks), and the media items the
# loaded runner takes (verify's image prompts are made of them). The host overhead bench
# also times the server's own per-token host work (sampling, detokenising).
RUNTIME_FOR_BUILD = {
    "runtime",
    "runtime.model",
    "runtime.model.loader",
    "runtime.model.media",
    "runtime.model.ranks",
    "runtime.model.neuron_sdk",
}
RUNTIME_FOR_BENCH = {
    "gemma4_port.bench.host_overhead": {"runtime.generate.sampling", "runtime.generate.detok"},
    # it times the server's constrained choice and logprobs with the server's own code
    "gemma4_port.bench.constrained": {
        "runtime.generate.grammar",
        "runtime.generate.logits",
        "runtime.generate.logprobs",
        "runtime.generate.sampling",
    },
    # `serve` is one of the command line's commands: it hands the artifact to the server's entry
    "gemma4_port.cli": {"runtime.serve"},
}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports: `from pkg import mod` names the module, not the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules and t != name}
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def wrong_direction(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in sorted(graph.items()):
        top = module.split(".")[0]
        for t in sorted(targets):
            t_top = t.split(".")[0]
            if top == "contract" and t_top != "contract":
                bad.append(f"{module} -> {t}: contract imports neither runtime nor gemma4_port")
            elif top == "runtime" and t_top == "gemma4_port":
                bad.append(f"{module} -> {t}: the server imports nothing from the build package")
            elif (
                top == "gemma4_port"
                and t_top == "runtime"
                and t not in RUNTIME_FOR_BUILD | RUNTIME_FOR_BENCH.get(module, set())
            ):
                bad.append(f"{module} -> {t}: the build package takes only the load path from runtime")
    return bad


def test_imports_run_one_way():
    graph = import_graph()
    assert {"contract.artifact", "runtime.model.loader", "gemma4_port.compile.backends"} <= set(
        graph
    )  # the walk saw them
    assert wrong_direction(graph) == []


def test_no_module_imports_itself_back():
    assert cycles(import_graph()) == []


def test_the_checks_catch_what_they_are_for():
    """A cycle through a lazy import and each wrong direction are found (the checks can fail)."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    bad = wrong_direction(
        {
            "contract.x": {"runtime.generate.engine"},
            "runtime.generate.engine": {"gemma4_port.compile.backends"},
            "gemma4_port.verify.run": {"runtime.generate.engine", "runtime.model.loader"},
            "runtime.model.loader": set(),
            "gemma4_port.compile.backends": set(),
        }
    )
    assert [b.split(":")[0] for b in bad] == [
        "contract.x -> runtime.generate.engine",
        "gemma4_port.verify.run -> runtime.generate.engine",
        "runtime.generate.engine -> gemma4_port.compile.backends",
    ]
    tmp = {"pkg.a": ROOT / "contract" / "errors.py"}
    assert imports_of("pkg.a", tmp["pkg.a"], tmp) == set()


def test_lazy_and_relative_imports_are_seen(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from .b import x\nfrom . import c\ndef f():\n    from pkg.sub import d\n    import pkg.e\n")
    modules = {name: src for name in ("pkg.m", "pkg.b", "pkg.c", "pkg.sub", "pkg.sub.d", "pkg.e")}
    assert imports_of("pkg.m", src, modules) == {"pkg.b", "pkg.c", "pkg.sub.d", "pkg.e"}


def test_the_decoder_pieces_sit_below_the_decoder():
    """The layer pieces and the KV helpers take only the sharding plan from the port; the decoder builds
    on them, and the traceable graphs on the decoder (so a new graph imports no further than decoder)."""
    graph = import_graph()
    port = {name for name in graph if name.startswith("gemma4_port.port.")}
    below = {"gemma4_port.port.layers", "gemma4_port.port.kv"}
    assert below <= port
    for name in below:
        assert graph[name] & port <= {"gemma4_port.port.sharding"}, name
    assert below <= graph["gemma4_port.port.decoder"]
    assert "gemma4_port.port.decoder" in graph["gemma4_port.port.graphs"]
