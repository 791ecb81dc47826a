"""CPU kernels in C (``npu_ops/csrc``), compiled once per machine with the system C compiler and
loaded with ctypes: paged attention (attention.c reads each query row's context in place through
the block tables: PyTorch has no paged op for the CPU, and gathering the blocks into padded tensors
for SDPA cost more than the attention itself), the packed fp32 GEMM of the linears (gemm.c) and
fused RMSNorm, rotary and SiLU-multiply (elementwise.c), and all of a step's fp32 decoder layers in one
call (layers_f32.c); csrc/README.md maps the files.

The engine calls ``configure(enabled, cache_dir)`` with its config (``cpu_kernels``,
``kernel_cache_dir``) before loading a model; ``MINDIE_CPU_KERNELS`` (0/1) and ``MINDIE_KERNEL_CACHE``
override it (read in ``settings()`` only). The library is built on first use into the cache folder
(default ``~/.cache/mindie_service/kernels``), keyed by the sources, flags, compiler and CPU; it links
the OpenMP runtime PyTorch has already loaded, so both share one thread pool. Anything that goes wrong
(no compiler, a failed build, the kernels switched off) leaves the portable PyTorch path in use, with
the reason logged and shown by ``describe()``."""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from array import array
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import torch

logger = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11"]
# Pointers cross as plain integers (Tensor.data_ptr()): cheaper per call than ctypes pointer objects.
_I64, _I32P, _F32P = ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p


@dataclass(frozen=True)
class KernelSettings:
    enabled: bool = True  # False: every CPU fast path off (these kernels and the packed linears)
    cache_dir: str | None = None  # None: the user's cache folder (see _cache_dirs)
    why_off: str = ""  # what switched them off, for describe()


_configured = KernelSettings()


def configure(enabled: bool = True, cache_dir: str | None = None) -> None:
    """Set from the engine config before a model loads; the environment still overrides (``settings``).
    A change takes effect at the next ``load()``; weights already packed keep their kernels."""
    global _configured
    new = KernelSettings(enabled, cache_dir or None, "" if enabled else "cpu_kernels: false in the engine config")
    if new != _configured:
        _configured = new
        load.cache_clear()


def settings() -> KernelSettings:
    """``configure``'s settings with the environment's overrides: the one place ``MINDIE_CPU_KERNELS`` and
    ``MINDIE_KERNEL_CACHE`` are read."""
    s, switch, folder = _configured, os.environ.get("MINDIE_CPU_KERNELS"), os.environ.get("MINDIE_KERNEL_CACHE")
    if switch is not None and switch.strip() in ("0", "1"):
        on = switch.strip() == "1"
        s = KernelSettings(on, s.cache_dir, "" if on else "MINDIE_CPU_KERNELS=0")
    if folder:
        s = KernelSettings(s.enabled, folder, s.why_off)
    return s


def _cache_dirs() -> list[Path]:
    """Where built kernels are kept: the configured folder, else the user's cache folder, else (read-only
    home, as in some containers) a per-user folder in the temp directory."""
    folder = settings().cache_dir
    if folder:
        return [Path(folder)]
    return [Path.home() / ".cache" / "mindie_service" / "kernels",
            Path(tempfile.gettempdir()) / f"mindie_service-kernels-{os.getuid() if hasattr(os, 'getuid') else 0}"]


def _cpu_signature() -> str:
    """-march=native code must not run on another CPU sharing the same home folder."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _build(cc: str, flags: list[str] = FLAGS) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True, timeout=30).stdout
    sources = sorted(CSRC.glob("*.c"))  # the files the key hashes are the files compiled
    key = hashlib.sha256("\0".join([*(p.read_text() for p in sorted(CSRC.glob("*.[ch]"))), " ".join(flags), version,
                                    platform.machine(), _cpu_signature()]).encode()).hexdigest()[:16]
    name = f"cpu_kernels-{key}.so"
    for folder in _cache_dirs():
        if (folder / name).exists():
            return folder / name
    for folder in _cache_dirs():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if os.access(folder, os.W_OK):
                break
        except OSError:
            continue
    else:
        raise RuntimeError(f"no writable folder for built kernels among {[str(f) for f in _cache_dirs()]}")
    out = folder / name
    # Build beside the target and rename: concurrent builders (test workers, servers) never see half a file.
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        part = Path(tmp) / out.name
        proc = subprocess.run([cc, *flags, "-o", str(part), *map(str, sources), "-lm"], capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[-500:]}")
        os.replace(part, out)
    logger.info("built CPU kernel %s", out)
    return out


_status = "not loaded yet"
# The library last loaded: weights packed with it keep running on it after the kernels are switched off
# (e.g. a later engine in this process configured with cpu_kernels: false).
_last_loaded: ctypes.CDLL | None = None


def loaded(declare: Callable[[ctypes.CDLL], ctypes.CDLL]) -> ctypes.CDLL:
    """The kernels this process loaded (the last ones, where they were switched off since: weights packed with
    them keep running), with ``declare``'s ctypes types set; RuntimeError where none were ever loaded."""
    lib = load() or _last_loaded
    if lib is None:
        raise RuntimeError("the CPU kernels are not loaded")
    return declare(lib)


def describe() -> str:
    """One line for /info and the start-up log: which CPU attention and elementwise path runs, and why."""
    load()
    return f"CPU kernels: {_status}"


def _unavailable(why: str, level: int = logging.WARNING) -> None:
    global _status
    _status = f"off ({why}); PyTorch reference path"
    logger.log(level, "CPU kernels %s", _status)


def switched_off() -> bool:
    """Every CPU fast path off (these kernels and the packed linears): ``configure(enabled=False)`` or
    ``MINDIE_CPU_KERNELS=0``."""
    return not settings().enabled


AVX2_ONLY = ["-mno-avx512f", "-mno-avxvnni"]  # the build a CPU without AVX-512 / VNNI runs


def build_variant(extra: list[str]) -> ctypes.CDLL:
    """The same sources built with ``extra`` flags after ours (e.g. ``AVX2_ONLY``, or a macro a benchmark sets):
    for tests and A/Bs that compare builds in one process; raises where no compiler is found."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler found")
    return ctypes.CDLL(str(_build(cc, [*FLAGS, *extra])))


@lru_cache(maxsize=1)
def load() -> ctypes.CDLL | None:
    """The compiled kernels, or None (reason logged) where they cannot be had."""
    global _status, _last_loaded
    current = settings()
    if not current.enabled:
        _unavailable(current.why_off, logging.INFO)
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        _unavailable("no C compiler found")
        return None
    try:
        path = _build(cc)
        lib = ctypes.CDLL(str(path))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        _unavailable(str(exc))
        return None
    _status = f"on ({path.name})"
    _last_loaded = _declare(lib)
    return _last_loaded


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Argument and result types of every kernel entry point, as csrc/kernels.h declares them
    (tests/unit/test_csrc_kernels_h.py holds the two together)."""
    fn = lib.paged_attention_rows_f32
    fn.argtypes = [_F32P, _F32P, _F32P, _I32P, _I32P, _I32P, _F32P, _I64, _I64, _I64, _I64, _I64, _I64, _I64,
                   ctypes.c_float, ctypes.c_int]
    fn.restype = ctypes.c_int
    lib.rms_norm_f32.argtypes = [_F32P, _F32P, _F32P, _I64, _I64, ctypes.c_float, ctypes.c_int]
    lib.silu_mul_f32.argtypes = [_F32P, _F32P, _I64, _I64, ctypes.c_int]
    lib.rotary_f32.argtypes = [_F32P, _I64, _F32P, _F32P, _F32P, _I64, _I64, _I64, ctypes.c_int]
    lib.packed_weight_numel.argtypes, lib.packed_weight_numel.restype = [_I64, _I64], _I64
    lib.pack_weight_f32.argtypes = [_F32P, _I64, _I64, _F32P]
    lib.linear_f32.argtypes = [_F32P, _I64, _I64, _F32P, _I64, _F32P, _F32P, ctypes.c_int]
    for name in ("rms_norm_f32", "silu_mul_f32", "rotary_f32", "pack_weight_f32", "linear_f32"):
        getattr(lib, name).restype = None
    # fp32: every decoder layer of a step in one call (csrc/layers_f32.c, mindie_service/models/fused_layers.py)
    lib.llama_layers_f32_work.argtypes, lib.llama_layers_f32_work.restype = [_I64] * 6, _I64
    lib.llama_layers_f32.argtypes = [ctypes.c_void_p, _I64, _F32P, *[_I64] * 6, ctypes.c_float, _F32P, _F32P, _I32P,
                                     _I32P, _I64, _I64, _I32P, _I32P, _I64, ctypes.c_float, _F32P, ctypes.c_int,
                                     ctypes.c_int]  # nthreads, gguf_step
    lib.llama_layers_f32.restype = ctypes.c_int
    lib.greedy_rows_f32.argtypes, lib.greedy_rows_f32.restype = [_F32P, _I64, _I64, _I32P, _F32P, ctypes.c_int], ctypes.c_int
    # a whole decode step (csrc/decode_f32.c, mindie_service/models/fused_decode.py)
    lib.decode_f32_work.argtypes, lib.decode_f32_work.restype = [_I64] * 7, _I64
    lib.llama_decode_f32.argtypes, lib.llama_decode_f32.restype = [ctypes.c_void_p], ctypes.c_int
    lib.llama_decode_steps_f32.argtypes = [ctypes.c_void_p, _I64] + [ctypes.c_void_p] * 4
    lib.llama_decode_steps_f32.restype = ctypes.c_int
    # the fused decoder team's barrier, checked (csrc/team_sync.c)
    lib.team_sync_check.argtypes, lib.team_sync_check.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    lib.team_work_check.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                                    ctypes.POINTER(ctypes.c_int64)]
    lib.team_work_check.restype = ctypes.c_int
    lib.team_work_slow.argtypes, lib.team_work_slow.restype = [ctypes.c_int, ctypes.c_int], None
    lib.team_work_stolen.argtypes, lib.team_work_stolen.restype = [], ctypes.c_long
    return lib


def supports(*tensors: torch.Tensor) -> bool:
    """All fp32 on the CPU with unit stride in their last dimension, and the kernels built."""
    for t in tensors:
        if t.dtype != torch.float32 or t.device.type != "cpu" or t.stride(-1) != 1:
            return False
    return load() is not None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., dim] (rows contiguous), weight [dim] -> [..., dim]; see ops.rms_norm_ref."""
    lib, x, w = load(), x.contiguous(), weight.contiguous()
    out = torch.empty_like(x)
    lib.rms_norm_f32(x.data_ptr(), w.data_ptr(), out.data_ptr(), x.numel() // x.shape[-1], x.shape[-1],
                     float(eps), torch.get_num_threads())
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[rows, 2 * inter] (gate then up) -> silu(gate) * up [rows, inter]."""
    lib, gu = load(), gate_up.contiguous()
    rows, inter = gu.shape[0], gu.shape[1] // 2
    out = gu.new_empty(rows, inter)
    lib.silu_mul_f32(gu.data_ptr(), out.data_ptr(), rows, inter, torch.get_num_threads())
    return out


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [rows, heads, head_dim] with heads packed in each row (any row stride, e.g. a slice of the
    fused qkv output); cos, sin [rows, head_dim] -> rotated, contiguous; see ops.rotary_ref."""
    lib, cos, sin = load(), cos.contiguous(), sin.contiguous()
    rows, heads, d = x.shape
    assert x.stride(1) == d and x.stride(2) == 1, "heads must be packed within a row"
    out = x.new_empty(rows, heads, d)
    lib.rotary_f32(x.data_ptr(), x.stride(0), cos.data_ptr(), sin.data_ptr(), out.data_ptr(), rows,
                   heads, d, torch.get_num_threads())
    return out


def paged_attention_rows(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                         row_seq: torch.Tensor, row_pos: torch.Tensor, scale: float) -> torch.Tensor:
    """q [T, H, D] fp32: row t belongs to sequence row_seq[t] (a row of block_tables [S, max_blocks]
    int32) at position row_pos[t], and attends to its positions 0..row_pos[t] in the caches
    [num_blocks, block_size, KVH, D] (contiguous). Returns [T, H, D]. Call ``supports`` first."""
    lib = load()
    assert lib is not None
    return call_attention_rows(lib.paged_attention_rows_f32, "paged_attention_rows_f32", q, k_cache, v_cache,
                               block_tables, row_seq, row_pos, scale)


def call_attention_rows(fn: Any, name: str, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, row_seq: torch.Tensor, row_pos: torch.Tensor,
                        scale: float) -> torch.Tensor:
    """The ctypes call shared by the attention-rows kernels (fp32 and int8 pages): same arguments, same
    return code contract."""
    q = q.contiguous()
    bt = block_tables.to(torch.int32).contiguous()
    seq, pos = row_seq.to(torch.int32).contiguous(), row_pos.to(torch.int32).contiguous()
    t, h, d = q.shape
    _, bs, kvh, _ = k_cache.shape
    out = torch.empty_like(q)
    rc = fn(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), bt.data_ptr(), seq.data_ptr(), pos.data_ptr(),
            out.data_ptr(), t, bt.shape[0], h, kvh, d, bs, bt.shape[1], float(scale), torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"{name} failed with code {rc} (bad shapes, rows or positions)")
    return out


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] fp32 -> the panel layout ``linear`` takes (csrc/gemm.c)."""
    lib, w = load(), weight.detach().contiguous()
    n, k = w.shape
    packed = torch.empty(lib.packed_weight_numel(n, k), dtype=torch.float32)
    lib.pack_weight_f32(w.data_ptr(), n, k, packed.data_ptr())
    return packed


def linear(x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] fp32 . W^T (+ bias) with W packed by ``pack_weight`` -> [M, out_features]."""
    lib, x = load() or _last_loaded, x.contiguous()
    m, k = x.shape
    y = x.new_empty(m, out_features)
    b = None if bias is None else bias.detach().contiguous()
    lib.linear_f32(x.data_ptr(), m, k, packed.data_ptr(), out_features, None if b is None else b.data_ptr(),
                   y.data_ptr(), torch.get_num_threads())
    return y


def greedy_rows(logits: torch.Tensor) -> tuple[list[int], list[float]] | None:
    """logits [rows, vocab] fp32 -> each row's first argmax and its log-probability (logit - logsumexp), in one
    pass pair over the row; None where a logit is NaN or infinite (or the kernels are not here)."""
    lib = load()
    if lib is None or not supports(logits) or logits.dim() != 2:
        return None
    x = logits.contiguous()
    rows = x.shape[0]
    # array buffers, not tensors: right after a decode step's weights have streamed through the caches, each
    # small PyTorch op costs tens of microseconds
    idx, lp = array("q", bytes(8 * rows)), array("f", bytes(4 * rows))
    if lib.greedy_rows_f32(x.data_ptr(), rows, x.shape[1], idx.buffer_info()[0], lp.buffer_info()[0],
                           torch.get_num_threads()):
        return None
    return idx.tolist(), lp.tolist()
