"""Password hashing, opaque tokens and the box that encrypts stored secrets."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

# Prefixes make leaked secrets recognisable to people and secret scanners.
SESSION_TOKEN_PREFIX = "sxwl_"  # noqa: S105 - a prefix, not a secret
ACCESS_KEY_PREFIX = "sxak_"


class Passwords:
    """argon2id with parameters from the settings."""

    def __init__(self, time_cost: int, memory_kib: int, parallelism: int) -> None:
        self._hasher = PasswordHasher(time_cost=time_cost, memory_cost=memory_kib, parallelism=parallelism)
        # Verified against when an email is unknown, so both paths cost one argon2 run.
        self._dummy = self._hasher.hash(secrets.token_urlsafe(16))

    def hash(self, password: str) -> str:
        return self._hasher.hash(password)

    def verify(self, stored: str | None, password: str) -> bool:
        try:
            return self._hasher.verify(stored or self._dummy, password) and stored is not None
        except (VerificationError, InvalidHashError):
            return False


def new_token(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """Lookup hash of a high-entropy token; a fast hash is enough because tokens cannot be guessed."""
    return hashlib.sha256(token.encode()).hexdigest()


class SecretBox:
    """Authenticated encryption of small secrets with a key derived from SXWL_SECRET_KEY."""

    def __init__(self, secret_key: str) -> None:
        self._master = secret_key.encode()
        derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"sxwl secret box v1").derive(
            self._master
        )
        self._fernet = Fernet(base64.urlsafe_b64encode(derived))

    def mac(self, purpose: bytes, message: bytes) -> bytes:
        """HMAC-SHA256 of ``message`` under a key derived for ``purpose`` alone: a value only this
        cloud (and its replicas, which share SXWL_SECRET_KEY) can compute, again whenever it is needed."""
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose).derive(self._master)
        return hmac.digest(key, message, "sha256")

    def encrypt(self, plaintext: str) -> str:
        return self._fernet.encrypt(plaintext.encode()).decode()

    def decrypt(self, ciphertext: str) -> str:
        try:
            return self._fernet.decrypt(ciphertext.encode()).decode()
        except InvalidToken:
            raise ValueError("stored secret cannot be decrypted: was SXWL_SECRET_KEY changed?") from None
