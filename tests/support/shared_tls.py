"""One default TLS context per test process for httpx.

httpx's module-level calls (``httpx.get(…)`` and the rest) make a Client per call, and each Client
makes a TLS context that loads certifi's CA bundle: about 30 ms of CPU, even for the plain-HTTP
servers the tests poll many times a second. Profiled, that was most of the test workers' CPU. The
default context is built once per process here and handed to every Client that asks for it; a
Client given its own context (``verify=…``) still gets that one. (httpcore sets a context's ALPN
protocols as it connects: the tests' TLS servers all come with contexts of their own.)"""

from __future__ import annotations

import functools
import os
import ssl

from httpx import _config
from httpx._transports import default
from httpx._types import CertTypes

_MAKE = _config.create_ssl_context


@functools.cache
def _shared(trust_env: bool, cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    return _MAKE(verify=True, cert=None, trust_env=trust_env)


def _create(
    verify: ssl.SSLContext | str | bool = True, cert: CertTypes | None = None, trust_env: bool = True
) -> ssl.SSLContext:
    if verify is True and cert is None:
        # Keyed by what httpx reads from the environment, so a test that sets it gets its own.
        return _shared(trust_env, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    return _MAKE(verify=verify, cert=cert, trust_env=trust_env)


def install() -> None:
    """From now on in this process (idempotent)."""
    vars(default)["create_ssl_context"] = _create  # the name its transports call it by
