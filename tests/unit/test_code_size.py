"""Size and shape rules of all of inflight/, the server included (docs/ARCHITECTURE.md, STYLE.md):
no function over 60 lines, no file over 400, no import circle. The few that were over when the
rule came have a ceiling (CEILINGS): split them when you touch them, and lower the ceiling."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import inflight

ROOT = Path(inflight.__file__).parent
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 400
# (path or path:function) -> a ceiling: what was over when the rule came (2026-11-26), with room
# for the changes in flight that day; lower them as the files are split, never raise them
CEILINGS: dict[str, int] = {}


def _sources() -> list[tuple[str, str]]:
    return [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted(ROOT.rglob("*.py"))]  # the server's too


def oversized() -> list[str]:
    found = []
    for path, src in _sources():
        sizes = {path: (len(src.splitlines()), MAX_FILE_LINES)}
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                sizes[f"{path}:{node.name}"] = (node.end_lineno - node.lineno + 1, MAX_FUNCTION_LINES)  # type: ignore[operator]
        for name, (lines, limit) in sizes.items():
            if lines > CEILINGS.get(name, limit):
                found.append(f"{name}: {lines} lines (at most {CEILINGS.get(name, limit)})")
    return found


def test_no_function_or_file_over_its_limit() -> None:
    assert oversized() == []


def _module_name(path: str) -> str:
    name = "inflight." + path.removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def import_graph(module_level: bool, srcs: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Module -> the inflight modules it imports (at module level only, or anywhere); `srcs`
    (module name -> source) defaults to the package's."""
    if srcs is None:
        srcs = {_module_name(p): s for p, s in [(str(q.relative_to(ROOT)), q.read_text()) for q in ROOT.rglob("*.py")]}
    graph: dict[str, set[str]] = {}
    for mod, src in srcs.items():
        tree = ast.parse(src)
        nodes = tree.body if module_level else list(ast.walk(tree))
        names: list[str] = []
        for node in nodes:  # module level: `if TYPE_CHECKING:` blocks are not imports at run time
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in srcs]
                names += subs if len(subs) == len(node.names) else [node.module, *subs]
        graph[mod] = {n for n in names if n in srcs and n != mod}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_at_module_level() -> None:
    assert circles(import_graph(module_level=True)) == []


def test_no_import_circle_even_inside_functions() -> None:
    """Not even through function-level imports: a lazy import that closes a circle hides a
    dependency both ways (the executor and the worker process, the loader and the quantized
    formats, config and the speculative option, the decode kernel and the quantized kernels, the
    CUDA graphs and their attention backend each had one). Move the shared piece down or pass it
    in; a lazy import that stays must point one way only."""
    assert circles(import_graph(module_level=False)) == []


def test_the_checks_see_a_circle_and_a_long_function() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    lazy = {"inflight.a": "def f() -> None:\n    from inflight.b import g\n", "inflight.b": "import inflight.a\n"}
    assert circles(import_graph(True, lazy)) == []  # the import inside f is not a module-level edge
    assert circles(import_graph(False, lazy)) == [["inflight.a", "inflight.b"]]
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    tree = ast.parse(f"def f():\n{body}\n")
    fn = tree.body[0]
    assert fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION_LINES  # type: ignore[attr-defined,operator]
