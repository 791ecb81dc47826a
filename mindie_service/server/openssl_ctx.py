"""Two OpenSSL settings that Python's ``ssl`` module (3.10-3.14) does not expose, set on the ``SSL_CTX`` under an
``ssl.SSLContext`` through libssl's own ``SSL_CTX_ctrl`` (the library ``_ssl`` is linked against):

- the key-exchange groups a server accepts (``SSL_CTX_set1_groups_list``): ``set_ecdh_curve`` takes one curve
  and never X25519, and OpenSSL's default list also accepts X448, secp521r1 and the ffdhe groups;
- ``SSL_MODE_NO_AUTO_CHAIN``: without it, a server certificate loaded alone has its chain built from the verify
  store when it is sent, so a server that verifies client certificates against its CA sends that CA (a trust
  anchor, which Mozilla's profiles say not to send) after its own certificate.

The pointer is read from the ``SSLContext`` object (its first field after the object header, as in CPython's
``_ssl.c``) and checked against the context's options and verify mode before anything is set on it."""
from __future__ import annotations

import ctypes
import functools
import logging
import ssl

logger = logging.getLogger(__name__)

_SSL_CTRL_MODE = 33
_SSL_CTRL_SET_GROUPS_LIST = 92
_SSL_MODE_NO_AUTO_CHAIN = 0x8
# SSL_VERIFY_PEER (1), | SSL_VERIFY_FAIL_IF_NO_PEER_CERT (2): ssl.CERT_* as _ssl.c maps them (other bits masked)
_VERIFY_MODE = {0: ssl.CERT_NONE, 1: ssl.CERT_OPTIONAL, 3: ssl.CERT_REQUIRED}


class OpenSSLUnavailable(RuntimeError):
    """libssl's SSL_CTX cannot be reached from this Python (another layout, or ``_ssl`` built in statically)."""


@functools.cache
def _libssl() -> ctypes.CDLL:
    import _ssl

    lib = ctypes.CDLL(getattr(_ssl, "__file__", None))  # its dependencies' symbols too: the libssl it uses
    try:
        lib.SSL_CTX_ctrl.restype, lib.SSL_CTX_ctrl.argtypes = ctypes.c_long, [ctypes.c_void_p, ctypes.c_int,
                                                                              ctypes.c_long, ctypes.c_void_p]
        lib.SSL_CTX_get_options.restype, lib.SSL_CTX_get_options.argtypes = ctypes.c_uint64, [ctypes.c_void_p]
        lib.SSL_CTX_get_verify_mode.restype, lib.SSL_CTX_get_verify_mode.argtypes = ctypes.c_int, [ctypes.c_void_p]
    except AttributeError as e:
        raise OpenSSLUnavailable(f"libssl's SSL_CTX functions are not reachable: {e}") from None
    return lib


def _ssl_ctx(lib: ctypes.CDLL, ctx: ssl.SSLContext) -> int:
    ptr = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
    if not ptr or lib.SSL_CTX_get_options(ptr) != int(ctx.options) or \
            _VERIFY_MODE.get(lib.SSL_CTX_get_verify_mode(ptr) & 3) != ctx.verify_mode:
        raise OpenSSLUnavailable("the SSLContext's SSL_CTX is not where CPython's _ssl.c keeps it")
    return ptr


def set_groups(ctx: ssl.SSLContext, groups: tuple[str, ...]) -> None:
    """Accept only ``groups`` (OpenSSL's names: X25519, P-256, P-384, ...) for the key exchange."""
    if hasattr(ctx, "set_groups"):  # a Python whose ssl module has it
        ctx.set_groups(":".join(groups))
        return
    lib = _libssl()
    if lib.SSL_CTX_ctrl(_ssl_ctx(lib, ctx), _SSL_CTRL_SET_GROUPS_LIST, 0, ":".join(groups).encode()) != 1:
        raise ValueError(f"OpenSSL {ssl.OPENSSL_VERSION} refused the groups {':'.join(groups)}")


def send_no_anchor(ctx: ssl.SSLContext) -> None:
    """Send the certificate file's chain as it is (SSL_MODE_NO_AUTO_CHAIN): never the verify store's CA."""
    lib = _libssl()
    mode = lib.SSL_CTX_ctrl(_ssl_ctx(lib, ctx), _SSL_CTRL_MODE, _SSL_MODE_NO_AUTO_CHAIN, None)
    if not mode & _SSL_MODE_NO_AUTO_CHAIN:
        raise OpenSSLUnavailable("SSL_MODE_NO_AUTO_CHAIN did not take")
