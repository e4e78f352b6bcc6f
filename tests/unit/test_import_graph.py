"""No circles between the project's modules: Python and C.

A circle says two modules are really one responsibility split badly
(DESIGN.md section 7 wants one per module); in Python it also makes the
import order matter (one side sees the other half initialised).

Python: every module of dmtcp_py, every import, at module level or inside
a function (a function-level import only hides a circle until that
function runs).  C: the shim's translation units (hijack/src/*.c), each
compiled on its own into a temporary directory; `nm` says which symbols a
unit defines and which it needs from elsewhere, and unit A depends on
unit B when A needs a symbol B defines.
"""
from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "dmtcp_py"
HIJACK = ROOT / "hijack"
# as in hijack/Makefile (its warning flags do not matter here)
CFLAGS = ["-std=c11", "-O2", "-fPIC", "-fvisibility=hidden", "-I", str(HIJACK / "include")]
DEFINED = set("TDBRVW")  # nm: text, data, bss, read-only, weak: defined in this unit


# ---- cycles ----------------------------------------------------------------------

def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search)."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {n: WHITE for n in edges}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        colour[n] = GREY
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if colour.get(m, BLACK) == GREY:
                return stack[stack.index(m):] + [m]
            if colour.get(m) == WHITE:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        colour[n] = BLACK
        return None

    for n in sorted(edges):
        if colour[n] == WHITE:
            found = visit(n)
            if found:
                return found
    return None


def test_finder_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


# ---- Python ----------------------------------------------------------------------

def modules() -> dict[str, Path]:
    """Module name -> file, for every module of the package."""
    out = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _absolute(name: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The absolute module an ImportFrom names (relative ones resolved)."""
    if not node.level:
        return node.module or ""
    base = name.split(".")
    # in a package's __init__, level 1 is the package itself
    base = base[:len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(name: str, source: str, known: set[str], *, is_package: bool = False) -> set[str]:
    """The known modules that one module imports, anywhere in its source."""
    tree = ast.parse(source, name)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(name, node, is_package)
            for alias in node.names:
                # `from X import Y`: Y may be a submodule of X, then the
                # dependency is on X.Y, not on X's __init__
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in known else base)
    return {m for m in out if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports(name, path.read_text(), known, is_package=path.name == "__init__.py")
            for name, path in mods.items()}


def test_every_kind_of_import_counts():
    known = {"p", "p.a", "p.b", "p.c", "p.d", "p.e", "p.sub", "p.sub.f"}
    source = """
import p.a
from p import b, CONSTANT
from . import c
from .sub import f

def later():
    from p.d import thing
    import p.e as e
"""
    # a name that is no module (CONSTANT) stands for the package: p itself
    assert imports("p.x", source, known) == {"p", "p.a", "p.b", "p.c", "p.d", "p.e", "p.sub.f"}
    assert imports("p.sub", "from . import f\nfrom .. import a", known, is_package=True) \
        == {"p.sub.f", "p.a"}


def test_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_agent_does_not_import_the_coordinator():
    """What agent and coordinator share lives in dmtcp_py/protocol/."""
    edges = graph()
    wrong = sorted(f"{a} -> {b}" for a, deps in edges.items()
                   if a.startswith(f"{PACKAGE}.agent.")
                   for b in deps if b.startswith(f"{PACKAGE}.coordinator"))
    assert not wrong, wrong


# ---- C ---------------------------------------------------------------------------

needs_cc = pytest.mark.skipif(not (shutil.which("cc") and shutil.which("nm")),
                              reason="needs cc and nm")


def compile_units(out: Path) -> dict[str, Path]:
    """unit name -> object file, compiled in parallel."""
    jobs = {}
    for src in sorted((HIJACK / "src").glob("*.c")):
        obj = out / (src.stem + ".o")
        jobs[src.stem] = (obj, subprocess.Popen(["cc", *CFLAGS, "-c", "-o", str(obj), str(src)],
                                                stderr=subprocess.PIPE, text=True))
    for name, (obj, proc) in jobs.items():
        _, err = proc.communicate()
        assert proc.returncode == 0, f"{name}.c does not compile:\n{err}"
    return {name: obj for name, (obj, _) in jobs.items()}


def symbols(obj: Path) -> tuple[set[str], set[str]]:
    """(defined, undefined) global symbols of one object file."""
    defined, undefined = set(), set()
    out = subprocess.run(["nm", "-g", str(obj)], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] == "U":
            undefined.add(fields[1])
        elif len(fields) == 3 and fields[1] in DEFINED:
            defined.add(fields[2])
    return defined, undefined


def unit_graph(objects: dict[str, Path]) -> dict[str, set[str]]:
    """unit -> the units it needs a symbol of (libc's are nobody's here)."""
    table = {name: symbols(obj) for name, obj in objects.items()}
    owner: dict[str, str] = {}
    for name, (defined, _) in table.items():
        for sym in defined:
            assert sym not in owner, f"{sym} is defined in {owner[sym]}.c and {name}.c"
            owner[sym] = name
    return {name: {owner[s] for s in undefined if s in owner and owner[s] != name}
            for name, (_, undefined) in table.items()}


@needs_cc
def test_no_cycle_between_translation_units(tmp_path):
    edges = unit_graph(compile_units(tmp_path))
    # the graph is real: the checkpoint thread drives the link and the API
    assert {"channel", "api"} <= edges["ckpt_thread"]
    cycle = find_cycle(edges)
    assert cycle is None, "translation units in a circle: " + " -> ".join(f"{u}.c" for u in cycle)
