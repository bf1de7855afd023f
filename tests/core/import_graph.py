"""The project's import graph, read from the source (nothing is imported): what tests/core/test_layers.py
enforces, and what `python tests/core/import_graph.py [ROOT]` prints for a person.

- **module-top imports**: what a module executes when it is imported — imports at module level, in class
  bodies and under module-level `if`/`try`, but not inside functions and not under `if TYPE_CHECKING:`.
- **cycles**: among all project imports, module-top and deferred alike (an import moved into a function
  still ties the two modules); none is allowed.
- **deferred imports**: a project import inside a function. Allowed only where it is a start-up saving,
  marked `# startup` on the import line, and only where it is one: the deferred module's module-top
  closure loads a heavy library (HEAVY) that the importing module's own closure does not.
- **floors**: `docs/ARCHITECTURE.md` draws the packages on floors; a package may import only from its
  own floor's package and from floors below (checked on both kinds of import).
"""
from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

PROJECT = ("components", "catalog", "flows")
MARKER = "# startup"
# Libraries whose import costs a command noticeable time against `veil --help`'s 0.5 s (measured:
# `python -X importtime`, 2-core machine: torch ~4 s, peft ~8 s with torch, MLflow ~3 s, dp-accounting
# ~2 s, Prefect ~2.5 s, transformers ~2 s, scipy.optimize ~1 s; duckdb, SQLAlchemy, pyarrow (with its
# compute kernels) ~0.3 s each; numpy, pandas, pydantic, cryptography 0.1–0.2 s each).
HEAVY = frozenset({"torch", "transformers", "peft", "mlflow", "dp_accounting", "scipy", "prefect",
                   "sentence_transformers", "mauve", "sqlalchemy", "alembic", "duckdb", "psycopg", "psycopg2",
                   "accelerate", "datasets", "sklearn", "matplotlib", "numpy", "pyarrow", "pandas", "pydantic",
                   "cryptography"})


@dataclass
class Imp:
    target: str             # project module name, or a third-party top-level name
    line: int
    deferred: bool
    marked: bool
    project: bool


@dataclass
class Graph:
    root: Path
    modules: dict[str, Path] = field(default_factory=dict)
    imports: dict[str, list[Imp]] = field(default_factory=dict)

    def top(self, m: str) -> set[str]:
        return {i.target for i in self.imports.get(m, ()) if i.project and not i.deferred}

    def edges(self, m: str) -> set[str]:
        """Every project module `m` imports, at module top or inside a function."""
        return {i.target for i in self.imports.get(m, ()) if i.project}

    def closure(self, m: str) -> tuple[set[str], set[str]]:
        """(project modules, third-party top-level names) executed by importing `m` (module-top only;
        a module's ancestor packages' __init__ included, as Python runs them)."""
        seen, third, todo = set(), set(), [m]
        while todo:
            x = todo.pop()
            if x in seen:
                continue
            seen.add(x)
            for i in self.imports.get(x, ()):
                if i.deferred:
                    continue
                if i.project:
                    todo.append(i.target)
                else:
                    third.add(i.target)
            parts = x.split(".")
            for k in range(1, len(parts)):
                pkg = ".".join(parts[:k])
                if pkg in self.modules:
                    todo.append(pkg)
        return seen, third


def module_name(root: Path, p: Path) -> str:
    parts = list(p.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _resolve(mods: dict, name: str) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def read(root: Path | str) -> Graph:
    root = Path(root)
    g = Graph(root)
    for top in PROJECT:
        for p in sorted((root / top).rglob("*.py")):
            g.modules[module_name(root, p)] = p
    for m, p in g.modules.items():
        src = p.read_text(encoding="utf-8")
        lines = src.split("\n")
        tree = ast.parse(src, filename=str(p))
        pkg = m if p.name == "__init__.py" else m.rpartition(".")[0]
        out: list[Imp] = []

        def add(name: str, node: ast.stmt, deferred: bool) -> None:
            head = name.split(".")[0]
            marked = MARKER in lines[node.lineno - 1]
            if head in PROJECT:
                tgt = name if name in g.modules else _resolve(g.modules, name)
                if tgt:
                    out.append(Imp(tgt, node.lineno, deferred, marked, True))
            else:
                out.append(Imp(head, node.lineno, deferred, marked, False))

        def visit(node: ast.AST, deferred: bool) -> None:
            for ch in ast.iter_child_nodes(node):
                if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    visit(ch, True)
                elif isinstance(ch, ast.If) and _type_checking(ch.test):
                    visit(ast.Module(body=ch.orelse, type_ignores=[]), deferred)
                elif isinstance(ch, ast.Import):
                    for a in ch.names:
                        add(a.name, ch, deferred)
                elif isinstance(ch, ast.ImportFrom):
                    if ch.level:
                        base = pkg.split(".")[: len(pkg.split(".")) - (ch.level - 1)]
                        mod = ".".join(base + ([ch.module] if ch.module else []))
                    else:
                        mod = ch.module or ""
                    for a in ch.names:
                        sub = f"{mod}.{a.name}"
                        add(sub if sub in g.modules else mod, ch, deferred)
                else:
                    visit(ch, deferred)

        visit(tree, False)
        g.imports[m] = out
    return g


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def cycles(g: Graph) -> list[list[str]]:
    """Strongly connected components of more than one module (or a module importing itself), counting
    every project import, deferred ones too: an import moved into a function still ties the two modules
    (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.edges(v)):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in g.edges(v):
                out.append(sorted(comp))

    for v in sorted(g.modules):
        if v not in index:
            strong(v)
    return out


def unmarked_deferred(g: Graph) -> list[str]:
    """Project imports inside functions without the marker."""
    return [f"{g.modules[m].relative_to(g.root)}:{i.line}: {i.target}"
            for m, imps in sorted(g.imports.items()) for i in imps if i.project and i.deferred and not i.marked]


def needless_markers(g: Graph) -> list[str]:
    """Marked deferred imports that defer no heavy library: the deferred module's closure loads nothing
    in HEAVY that the importing module does not load already."""
    bad = []
    for m, imps in sorted(g.imports.items()):
        own = None
        for i in imps:
            if not (i.project and i.deferred and i.marked):
                continue
            if own is None:
                own = g.closure(m)[1]
            saved = (g.closure(i.target)[1] & HEAVY) - own
            if not saved:
                bad.append(f"{g.modules[m].relative_to(g.root)}:{i.line}: {i.target} (loads no heavy library "
                           f"that {m} does not load already)")
    return bad


FLOOR_LINE = re.compile(r"^\s*(\d+)\s+(.+?)\s*$")


def floors(architecture: Path) -> dict[str, int]:
    """package → floor, from the fenced ```floors block of docs/ARCHITECTURE.md: lines `N  pkg, pkg …`
    (a package named by its dotted path; `flows` and `catalog` as a whole)."""
    text = architecture.read_text(encoding="utf-8")
    m = re.search(r"```floors\n(.*?)```", text, re.S)
    if not m:
        raise ValueError(f"{architecture}: no ```floors block")
    out: dict[str, int] = {}
    for line in m.group(1).splitlines():
        f = FLOOR_LINE.match(line.split("—")[0])
        if not f:
            continue
        for name in re.split(r"[,\s]+", f.group(2).strip()):
            if name:
                out[name.strip("`")] = int(f.group(1))
    return out


def package_of(module: str, fl: dict[str, int]) -> str | None:
    parts = module.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in fl:
            return ".".join(parts[:k])
    return None


def floor_violations(g: Graph, fl: dict[str, int]) -> list[str]:
    """Imports (module-top or deferred) from a package on a higher floor, or from another package on the
    same floor; and modules of no floor."""
    bad = []
    for m, imps in sorted(g.imports.items()):
        pa = package_of(m, fl)
        if pa is None:
            if m not in PROJECT and m != "components":
                bad.append(f"{m}: on no floor of docs/ARCHITECTURE.md")
            continue
        for i in imps:
            if not i.project:
                continue
            pb = package_of(i.target, fl)
            if pb is None or pb == pa:
                continue
            if fl[pb] >= fl[pa]:
                bad.append(f"{g.modules[m].relative_to(g.root)}:{i.line}: {pa} (floor {fl[pa]}) imports {pb} "
                           f"(floor {fl[pb]})")
    return bad


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    g = read(root)
    cyc = cycles(g)
    print(f"{len(g.modules)} modules; {len(cyc)} import cycles")
    for c in cyc:
        print(f"  cycle of {len(c)}: {', '.join(c)}")
    un = unmarked_deferred(g)
    print(f"{len(un)} project imports inside functions without '{MARKER}'")
    for x in un[:40]:
        print("  " + x)
    for x in needless_markers(g):
        print("  needless marker: " + x)
    arch = root / "docs" / "ARCHITECTURE.md"
    try:
        fl = floors(arch)
    except (OSError, ValueError) as e:
        print(f"floors: {e}")
    else:
        v = floor_violations(g, fl)
        print(f"{len(v)} imports against the floors")
        for x in v[:40]:
            print("  " + x)
