"""The public keys of a user's that their dev environments' sshd accepts (docs/dev-envs.md, "SSH").
A key is checked by parsing it as OpenSSH does, so what is kept is one line an authorized_keys file
takes; a private key, or anything else, is refused naming the field."""

from __future__ import annotations

import base64
import hashlib

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.serialization import load_ssh_public_key
from sqlalchemy import select
from sqlalchemy.orm import Session

from sxwl.cloud.db.devenv_models import SshKey
from sxwl.cloud.db.models import User
from sxwl.cloud.errors import AppError, invalid

MAX_KEYS = 50


def _checked(public_key: str) -> tuple[str, str]:
    """The key as one authorized_keys line, and its SHA256 fingerprint."""
    line = " ".join(public_key.strip().split())
    parts = line.split(" ")
    if "PRIVATE KEY" in public_key or len(parts) < 2 or "\n" in public_key.strip():
        raise invalid("public_key", "give one OpenSSH public key line (the .pub file), never a private key")
    try:
        load_ssh_public_key(" ".join(parts[:2]).encode())
        blob = base64.b64decode(parts[1], validate=True)
    except (ValueError, UnsupportedAlgorithm):
        raise invalid(
            "public_key", "not an OpenSSH public key (ssh-ed25519, ecdsa-sha2-*, ssh-rsa)"
        ) from None
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return line, f"SHA256:{digest}"


def add(session: Session, user: User, name: str, public_key: str) -> SshKey:
    line, fingerprint = _checked(public_key)
    mine = list_for(session, user)
    if any(key.fingerprint == fingerprint for key in mine):
        raise AppError(
            409, "public_key: this key is already on your account", details=[{"field": "public_key"}]
        )
    if len(mine) >= MAX_KEYS:
        raise invalid("public_key", f"at most {MAX_KEYS} keys per account")
    comment = line.split(" ", 2)[2] if line.count(" ") >= 2 else ""
    key = SshKey(
        owner_id=user.id, name=(name or comment or "key")[:100], public_key=line, fingerprint=fingerprint
    )
    session.add(key)
    session.flush()
    return key


def list_for(session: Session, user: User) -> list[SshKey]:
    return list(session.scalars(select(SshKey).where(SshKey.owner_id == user.id).order_by(SshKey.created_at)))


def remove(session: Session, user: User, key_id: str) -> None:
    key = session.get(SshKey, key_id) if key_id.isascii() and key_id.isalnum() and len(key_id) <= 32 else None
    if key is None or key.owner_id != user.id:
        raise AppError(404, f"no SSH key {key_id}")
    session.delete(key)


def authorized_keys(session: Session, owner_id: str) -> list[str]:
    return list(session.scalars(select(SshKey.public_key).where(SshKey.owner_id == owner_id)))
