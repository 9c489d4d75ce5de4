"""The artifact store the settings name, with the bucket's credentials read here, once: from the
standard AWS environment variables or SXWL_S3_CREDENTIALS_FILE (docs/object-storage.md)."""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from sxwl.cloud.config import Settings
from sxwl.cloud.storage import ArtifactStore
from sxwl.cloud.storage.local import LocalArtifactStore

if TYPE_CHECKING:
    from sxwl.cloud.storage.s3 import S3Credentials


class StoreSettingsError(ValueError):
    """A setting the S3 store needs is missing or unusable; the message names it."""


def artifact_store(settings: Settings, env: Mapping[str, str] = os.environ) -> ArtifactStore:
    if settings.artifact_store == "local":
        return LocalArtifactStore(settings.data_dir / "artifacts")
    # Here, not at the top: boto3 takes a while to import, and only an S3 cloud needs it.
    from sxwl.cloud.storage.s3 import S3ArtifactStore, S3Location

    endpoint = settings.s3_endpoint
    location = S3Location(
        endpoint=endpoint,
        public_endpoint=settings.s3_public_endpoint or endpoint,
        bucket=settings.s3_bucket,
        region=settings.s3_region,
        presign_expiry_s=settings.s3_presign_expiry_s,
    )
    return S3ArtifactStore(location, credentials(settings.s3_credentials_file, env))


def credentials(file: Path | None, env: Mapping[str, str]) -> S3Credentials:
    """The file's ``[default]`` section in the AWS credentials format, else the environment."""
    from sxwl.cloud.storage.s3 import S3Credentials

    if file is None:
        key_id, secret = env.get("AWS_ACCESS_KEY_ID", ""), env.get("AWS_SECRET_ACCESS_KEY", "")
        if not key_id or not secret:
            raise StoreSettingsError(
                "SXWL_ARTIFACT_STORE=s3 needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the "
                "environment, or SXWL_S3_CREDENTIALS_FILE"
            )
        return S3Credentials(key_id, secret, env.get("AWS_SESSION_TOKEN") or None)
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(file.read_text())
        section = parser["default"]
        return S3Credentials(
            section["aws_access_key_id"],
            section["aws_secret_access_key"],
            section.get("aws_session_token") or None,
        )
    except OSError as exc:
        raise StoreSettingsError(f"SXWL_S3_CREDENTIALS_FILE: cannot read {file}: {exc.strerror}") from None
    except (configparser.Error, KeyError):
        # The parser's own message may quote the file's lines, secrets included: say only where.
        raise StoreSettingsError(
            f"SXWL_S3_CREDENTIALS_FILE: {file} needs a [default] section with aws_access_key_id "
            "and aws_secret_access_key"
        ) from None
