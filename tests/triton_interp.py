"""Triton's interpreter on NumPy >= 2.4 (the tests run our kernels in it on CPU tensors).

The interpreter holds every scalar as a one-element array and, up to triton 3.6, turns it into a Python int
with ``int(array)``: NumPy 2.4 refuses that for an array of one dimension ("only 0-dimensional arrays can be
converted to Python scalars"), so any kernel loop with a bound read from memory (``range(0, n_ctx, BLOCK)``)
fails under the interpreter, though the compiled kernel is fine. Later triton reads ``int(array.squeeze())``;
this mends the older ones the same way, in the test process only (serving never interprets)."""
from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def mend_scalar_index() -> bool:
    """Make the interpreter's ``tensor.__index__`` take a one-element array of any rank. True if mended."""
    try:
        from triton.runtime import interpreter
    except Exception:  # noqa: BLE001 - no triton (or a broken one): nothing runs in its interpreter
        return False
    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "mindie_mended", False):
        return False

    def mended(tensor, scope):  # type: ignore[no-untyped-def] - triton's own private signature
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    mended.mindie_mended = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = mended
    logger.debug("triton interpreter: scalar __index__ mended for NumPy >= 2.4")
    return True
