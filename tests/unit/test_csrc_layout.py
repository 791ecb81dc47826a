"""The layout of the C kernels (npu_ops/csrc, mapped by its README.md): each .c has a header of its own declaring
what it exports to the other C files, kernels.h declares the entry points Python calls, and the files form no
circle. The include graph: file A -> file B where A includes B's header (or B itself), a .c and its own .h being one
node; the call graph adds A -> B where A calls an entry point that B defines (declared in kernels.h, so invisible
to the includes). Read from the sources as text: no compiler needed."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

CSRC = Path(__file__).resolve().parents[2] / "npu_ops" / "csrc"
KERNELS_H = "kernels.h"
FUNC = re.compile(r"(?P<ret>[\w\s*]+?)\b(?P<name>[A-Za-z_]\w*)\s*\((?P<params>.*)\)", re.S)


def _files(ext: str) -> list[Path]:
    return sorted(CSRC.glob(f"*.{ext}"))


def _node(name: str) -> str:
    return Path(name).stem  # x.c and x.h: one node


def _uncommented(path: Path) -> str:
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", path.read_text(), flags=re.S)


@lru_cache(maxsize=None)
def _code(path: Path) -> str:
    """The file at file scope as the parser reads it: no comments, no preprocessor lines (with their
    continuations), no lone macro invocations such as TILE(1)."""
    text = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", " ", _uncommented(path), flags=re.M)
    return re.sub(r"^[ \t]*[A-Z_][A-Z0-9_]*\([^;{}\n]*\)[ \t]*$", " ", text, flags=re.M)


def _top_level(code: str) -> list[tuple[str, str]]:
    """Each file-scope declaration's text before its '{' or ';', with that character."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(code):
        if ch == "{":
            if depth == 0:
                out.append((code[start:i], "{"))
            depth += 1
        elif ch == "}":
            depth -= 1
            start = i + 1 if depth == 0 else start
        elif ch == ";" and depth == 0:
            out.append((code[start:i], ";"))
            start = i + 1
    return out


@lru_cache(maxsize=None)
def _functions(path: Path) -> tuple[frozenset[str], frozenset[str]]:
    """(functions defined non-static, functions declared) at file scope."""
    defined, declared = set(), set()
    for head, end in _top_level(_code(path)):
        head = re.sub(r"__attribute__\s*\(\(.*?\)\)", " ", head).strip()
        m = FUNC.fullmatch(head)
        if m is None or "=" in head or "typedef" in m["ret"].split():
            continue
        if end == ";":
            declared.add(m["name"])
        elif "static" not in m["ret"].split():
            defined.add(m["name"])
    return frozenset(defined), frozenset(declared)


def _includes(path: Path) -> list[str]:
    return re.findall(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', _uncommented(path), flags=re.M)


def _entry_points() -> dict[str, str]:
    """kernels.h's functions -> the node that defines each."""
    where = {name: _node(p.name) for p in _files("c") for name in _functions(p)[0]}
    return {name: where.get(name, "?") for name in _functions(CSRC / KERNELS_H)[1]}


def _include_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for p in _files("c") + _files("h"):
        graph.setdefault(_node(p.name), set()).update(_node(i) for i in _includes(p) if _node(i) != _node(p.name))
    return graph


def _call_graph() -> dict[str, set[str]]:
    graph = {n: set(e) for n, e in _include_graph().items()}
    for name, owner in _entry_points().items():
        for p in _files("c"):
            if _node(p.name) != owner and re.search(rf"\b{name}\s*\(", _code(p)):
                graph[_node(p.name)].add(owner)
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str]:
    """A circle of the graph as its path (first node repeated at the end), or []."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str]:
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        state[n] = 2
        path.pop()
        return []

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return []


def test_the_parser_finds_definitions_and_declarations():
    defined, declared = _functions(CSRC / "team_sync.c")
    assert {"team_barrier", "team_share_of", "team_work_check"} <= defined
    assert not {"with_team", "relax", "barrier_rounds"} & defined  # static
    assert {"team_barrier", "team_share_of"} <= _functions(CSRC / "team_sync.h")[1]
    # gemm_gguf.c's Q4_1F pair, gemm_gguf_q8.c's four, gemm_gguf_q5*.c's six; gguf_linear.c's and gemm_gguf_tile.c's
    # test hooks (gguf_xq_team_rows, gguf_xq_share, gguf_tile_own_panels), gemm_gguf_q4_q8.c's gguf_int8_vnni
    assert len(_entry_points()) == 69


def test_every_source_file_has_a_header_of_its_own_and_includes_it():
    bad = [p.name for p in _files("c") if not p.with_suffix(".h").exists() or p.with_suffix(".h").name not in
           _includes(p)]
    assert not bad, f"without their own .h, or not including it: {bad}"


def test_every_included_file_is_in_csrc():
    missing = {f"{p.name}: {i}" for p in _files("c") + _files("h") for i in _includes(p) if not (CSRC / i).exists()}
    assert not missing, sorted(missing)


def test_the_include_graph_has_no_circle():
    circle = _circle(_include_graph())
    assert not circle, f"files that include each other's headers in a circle: {' -> '.join(circle)}"


def test_the_entry_points_close_no_circle_either():
    circle = _circle(_call_graph())
    assert not circle, f"a circle through kernels.h's entry points: {' -> '.join(circle)}"


def test_every_exported_function_is_declared_in_its_files_header_or_kernels_h():
    kernels = _functions(CSRC / KERNELS_H)[1]
    own = {p: _functions(p.with_suffix(".h"))[1] if p.with_suffix(".h").exists() else frozenset() for p in _files("c")}
    bad = [f"{p.name}: {name}" for p in _files("c") for name in sorted(_functions(p)[0] - own[p] - kernels)]
    assert not bad, f"defined non-static, declared in neither the file's own .h nor kernels.h: {bad}"


def test_headers_declare_only_their_own_files_functions():
    bad = []
    for h in _files("h"):
        own = h.with_suffix(".c")
        if h.name == KERNELS_H:
            bad += [f"kernels.h: {n} (defined in {o})" for n, o in _entry_points().items() if o == "?"]
        elif own.exists():
            bad += [f"{h.name}: {n}" for n in sorted(_functions(h)[1] - _functions(own)[0])]
        else:  # header-only: inline functions and macros
            bad += [f"{h.name}: {n}" for n in sorted(_functions(h)[1])]
    assert not bad, f"declared where they are not defined: {bad}"


def test_each_entry_point_is_defined_once_by_a_file_that_includes_kernels_h():
    owners: dict[str, list[str]] = {}
    for p in _files("c"):
        for name in _functions(p)[0] & _functions(CSRC / KERNELS_H)[1]:
            owners.setdefault(name, []).append(p.name)
    bad = {n: o for n, o in owners.items() if len(o) != 1 or KERNELS_H not in _includes(CSRC / o[0])}
    assert not bad, f"entry points defined more than once, or where kernels.h is not included: {bad}"


def test_the_readme_maps_every_file_top_to_bottom():
    rows = re.findall(r"^\| `([^`]+)`", (CSRC / "README.md").read_text(), flags=re.M)
    missing = [p.name for p in _files("c") + _files("h") if p.name not in rows]
    assert not missing, f"csrc/README.md does not map: {missing}"
    row = {}
    for i, name in enumerate(rows):
        row.setdefault(_node(name), i)
    upward = [f"{a} -> {b}" for a, edges in _call_graph().items() for b in edges if row[b] < row[a]]
    assert not upward, f"csrc/README.md's table is not top to bottom: {upward}"
