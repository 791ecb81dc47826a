"""npu_ops/csrc/kernels.h against the ctypes declarations: every entry point that cpu_kernels._declare,
quant_cpu._declare, quant_kv._declare, quant_gguf_kquant._declare and gguf_cpu._declare give types has kernels.h's name,
argument count, argument types and result type, and every function kernels.h declares is declared in Python. The compiler
holds the C definitions to kernels.h (each defining file includes it); this holds Python to it, so a signature changed
on one side fails here instead of passing garbage through ctypes."""
from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest

from npu_ops import cpu_kernels, gguf_cpu, quant_cpu, quant_gguf_kquant, quant_kv

KERNELS_H = Path(cpu_kernels.__file__).with_name("csrc") / "kernels.h"
# The ctypes type of each C scalar kernels.h may use. On LP64 int64_t and long are one type (c_int64 is c_long),
# as are int32_t and int.
SCALARS = {"int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32, "int": ctypes.c_int, "long": ctypes.c_long,
           "float": ctypes.c_float, "double": ctypes.c_double, "size_t": ctypes.c_size_t}
QUALIFIERS = {"const", "restrict", "volatile"}


def c_type(decl: str) -> tuple[str, int]:
    """'const float *restrict x' -> ('float', 1): the base type and the pointer depth, the parameter's name dropped."""
    toks = [t for t in re.findall(r"\w+|\*", decl) if t not in QUALIFIERS]
    if len(toks) > 1 and toks[-1] != "*" and toks[-2] != "struct":
        toks = toks[:-1]
    return " ".join(t for t in toks if t != "*"), toks.count("*")


def c_prototypes(text: str) -> dict[str, tuple[tuple[str, int], list[tuple[str, int]]]]:
    """kernels.h's functions: name -> (result type, argument types)."""
    code = re.sub(r"^\s*#.*$", " ", re.sub(r"/\*.*?\*/", " ", text, flags=re.S), flags=re.M)
    protos = {}
    for stmt in code.split(";"):
        m = re.fullmatch(r"(.+?)\b(\w+)\s*\((.*)\)", " ".join(stmt.split()))
        if m:  # not a struct's forward declaration
            ret, name, params = m.groups()
            args = [] if params.strip() in ("", "void") else params.split(",")
            protos[name] = (c_type(ret), [c_type(a) for a in args])
    return protos


class _Fn:
    def __init__(self) -> None:
        self.argtypes = None
        self.restype = ctypes.c_int  # ctypes' own default


class _Recorder:
    """Stands in for the CDLL: keeps what the _declare functions give each entry point (no library needed)."""

    def __init__(self) -> None:
        self.fns: dict[str, _Fn] = {}

    def __getattr__(self, name: str) -> _Fn:
        if name.startswith("__"):
            raise AttributeError(name)
        return self.fns.setdefault(name, _Fn())


def python_declarations() -> dict[str, _Fn]:
    out: dict[str, _Fn] = {}
    for declare in (cpu_kernels._declare, quant_cpu._declare, quant_kv._declare, quant_gguf_kquant._declare,
                    gguf_cpu._declare):
        rec = _Recorder()
        declare(rec)
        for name, fn in rec.fns.items():
            if name in out:  # one library: two modules must agree
                assert (out[name].argtypes, out[name].restype) == (fn.argtypes, fn.restype), name
            out[name] = fn
    return out


def matches(py: object, c: tuple[str, int]) -> bool:
    base, stars = c
    if stars == 0:
        return py is (None if base == "void" else SCALARS[base])
    if py is ctypes.c_void_p:  # pointers cross as Tensor.data_ptr() integers
        return True
    return (stars == 1 and isinstance(py, type) and issubclass(py, ctypes._Pointer)
            and py._type_ is SCALARS.get(base))  # type: ignore[attr-defined]


def mismatches(c_protos: dict, py_decls: dict[str, _Fn]) -> list[str]:
    bad = []
    for name, fn in sorted(py_decls.items()):
        if name not in c_protos:
            bad.append(f"{name}: declared in Python, not in kernels.h")
            continue
        ret, args = c_protos[name]
        if fn.argtypes is None or len(fn.argtypes) != len(args):
            bad.append(f"{name}: {len(args)} arguments in kernels.h, Python gives {fn.argtypes}")
            continue
        bad += [f"{name}: argument {i} is {a} in kernels.h, Python gives {t.__name__}"
                for i, (t, a) in enumerate(zip(fn.argtypes, args)) if not matches(t, a)]
        if not matches(fn.restype, ret):
            bad.append(f"{name}: returns {ret} in kernels.h, Python gives {fn.restype}")
    return bad


def test_the_parser_reads_every_declaration_of_kernels_h():
    protos = c_prototypes(KERNELS_H.read_text())
    assert len(protos) == len(re.findall(r"^[a-z].*\(", KERNELS_H.read_text(), flags=re.M))
    assert protos["team_work_check"] == (("int", 0), [("int", 0), ("int64_t", 0), ("int64_t", 0), ("int", 0),
                                                      ("int64_t", 1)])
    assert protos["llama_decode_f32"] == (("int", 0), [("struct decode_f32_args", 1)])
    assert protos["w8a8_panel_width"] == (("int", 0), [])


def test_python_declares_every_entry_point_as_kernels_h_does():
    bad = mismatches(c_prototypes(KERNELS_H.read_text()), python_declarations())
    assert not bad, "\n".join(bad)


def test_every_function_of_kernels_h_is_declared_in_python():
    missing = set(c_prototypes(KERNELS_H.read_text())) - set(python_declarations())
    assert not missing, f"in kernels.h, no ctypes declaration: {sorted(missing)}"


@pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")
def test_the_library_exports_every_function_of_kernels_h():
    lib = cpu_kernels.load()
    assert not [name for name in c_prototypes(KERNELS_H.read_text()) if not hasattr(lib, name)]
