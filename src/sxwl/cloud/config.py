"""Cloud settings, read from ``SXWL_*`` environment variables."""

from __future__ import annotations

import ipaddress
import os
import secrets
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sxwl.cloud.kit.logs import LogFormat

# A rate's window becomes a timedelta: NaN, infinity and the far future must fail here, at start-up.
_MAX_WINDOW_S = 366 * 86400


def parse_rate(text: str) -> tuple[int, float]:
    """``"N/S"`` means at most N events per S seconds."""
    count, _, seconds = text.partition("/")
    try:
        limit = int(count), float(seconds)
    except ValueError:
        raise ValueError(f"expected 'COUNT/SECONDS', got {text!r}") from None
    if limit[0] < 1 or not 0 < limit[1] <= _MAX_WINDOW_S:
        raise ValueError(f"count and seconds must be positive, seconds at most a year, got {text!r}")
    return limit


def _proxy_items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SXWL_", extra="ignore")

    data_dir: Path = Field(default=Path(".sxwl"), validate_default=True)
    database_url: str = ""
    secret_key: str = ""
    # The URL that CPods and browsers use to reach this cloud; defaults to the request's own.
    public_url: str = ""
    # Where other replicas reach this process, to relay streams into the agents' tunnels it holds
    # (docs/tunnel.md); empty: none relays here, so with several replicas each process needs its own.
    replica_url: str = ""
    # HTTP/2 PINGs on each agent's tunnel connection this often; one unanswered as long closes it.
    tunnel_ping_s: float = Field(default=20.0, gt=0, le=300)
    # The offline artifact (`make artifact`'s dist/3k-artifact.tgz) served at /downloads/3k-artifact.tgz
    # for providers (docs/artifact.md, "Serving"): a file beside the cloud, or the key of an object in
    # the S3 artifact store (several replicas, no shared disk); neither set, that path answers 404.
    artifact_file: Path | None = None
    artifact_key: str = ""
    # The oldest artifact version whose 3kctl and agent this cloud accepts (told to 3kctl with the
    # accessKey check, which stops an older artifact before it changes any host).
    artifact_min_version: str = Field(default="0.1.0", pattern=r"^[0-9]+(\.[0-9]+){0,3}$")

    session_ttl_s: int = 12 * 3600
    api_token_ttl_s: int = 7 * 24 * 3600
    # About 100 ms per hash on a 2-core build machine (see bench/RESULTS.md).
    argon2_time_cost: int = 3
    argon2_memory_kib: int = 47104
    argon2_parallelism: int = 1

    max_body_bytes: int = 1024 * 1024
    rate_login_ip: str = "30/60"
    rate_login_account: str = "10/300"
    rate_register_ip: str = "10/3600"
    rate_register_account: str = "5/3600"
    # How long a sign-in to an account over its failure limit waits before its password is checked
    # (docs/operations.md).
    login_locked_delay_s: float = Field(default=1.0, ge=0)

    # The reverse proxies whose X-Forwarded-For and X-Forwarded-Proto are believed (for rate limits
    # and logs): IP addresses or CIDR networks, comma-separated. Empty: nobody's.
    trusted_proxies: str = ""
    # Slow clients: the most a request's head (line and headers), its body, and an idle keep-alive
    # connection may take; an artifact upload, up to artifact_max_bytes, has its own.
    request_head_timeout_s: float = Field(default=10.0, gt=0)
    request_body_timeout_s: float = Field(default=30.0, gt=0)
    artifact_upload_timeout_s: float = Field(default=3600.0, gt=0)
    keep_alive_timeout_s: int = Field(default=5, ge=1)

    # The bearer token a Prometheus scrape of /metrics must send (docs/operations.md, "Metrics");
    # unset, /metrics answers no one.
    metrics_token: str = Field(default="", repr=False)

    log_level: str = "INFO"
    # auto: short text lines on a terminal, JSON lines otherwise (files, collectors).
    log_format: LogFormat = "auto"

    # CPods: the interval an agent is told to heartbeat at (it may ask for another within the bounds),
    # how many missed intervals make a CPod "unknown", and how much longer until it is "offline".
    heartbeat_interval_s: float = Field(default=10.0, gt=0)
    heartbeat_interval_min_s: float = Field(default=1.0, gt=0)
    heartbeat_interval_max_s: float = Field(default=300.0, gt=0)
    unknown_after_missed: int = Field(default=3, ge=1)
    offline_grace_s: float = Field(default=60.0, ge=0)
    liveness_check_s: float = Field(default=1.0, gt=0)
    heartbeat_max_bytes: int = 16 * 1024 * 1024
    heartbeat_max_nodes: int = Field(default=5000, ge=1)

    # Jobs.
    default_user_max_gpus: int = Field(default=0, ge=0)  # 0: no limit unless an admin sets one
    job_max_attempts: int = Field(default=3, ge=1)
    scheduler_interval_s: float = Field(default=1.0, gt=0)
    scheduler_batch: int = Field(default=2000, ge=1)
    # An agent's long-poll is held this long at most; one held past ``longpoll_keepalive_s`` gets a
    # newline that often, so load balancers that cut idle connections leave it open.
    longpoll_max_s: float = Field(default=1200.0, gt=0)
    longpoll_keepalive_s: float = Field(default=25.0, gt=0)
    # A /v1 stream gets an SSE comment line this often while its engine has sent nothing (no head,
    # or no first token yet): below the common 60 s idle timeout of load balancers.
    stream_keepalive_s: float = Field(default=15.0, gt=0, le=55)
    # How long a process remembers a /v1 call's credential and the replicas serving its model
    # (services/endpoints/call_cache.py); a user's own changes are seen at once regardless. 0: never.
    call_cache_s: float = Field(default=1.0, ge=0, le=600)
    log_chunk_max_bytes: int = Field(default=512 * 1024, ge=1)
    log_read_max_bytes: int = Field(default=1024 * 1024, ge=1)
    # A job attempt's log is kept up to this many bytes; the rest is dropped, with a line that says so.
    # The database holds only its latest part: older segments of log_segment_bytes go to the artifact
    # store (docs/jobs.en.md, "Logs").
    log_max_bytes: int = Field(default=128 * 1024 * 1024, ge=1)
    log_segment_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024)
    artifact_max_bytes: int = Field(default=1024 * 1024 * 1024, ge=1)
    # Fine-tuning: one uploaded training file (JSONL), one base model's archive (docs/finetune.md).
    file_max_bytes: int = Field(default=512 * 1024 * 1024, ge=1)
    model_max_bytes: int = Field(default=20 * 1024**3, ge=1)
    # What each user may keep in the store: their files, base models and jobs' artifacts, counted
    # from what is recorded (docs/operations.md, "Storage quotas"). 0: no limit.
    storage_quota_bytes: int = Field(default=100 * 1024**3, ge=0)

    max_page_size: int = Field(default=200, ge=1)

    # Money (docs/billing.md). Off: a private cloud whose work is free (nothing priced, metered or
    # charged, no balance needed); on, work is placed only at a price an admin set.
    billing_enabled: bool = True
    metering_interval_s: float = Field(default=30.0, gt=0)
    # How often each replica asks the running dev environments whether they are in use.
    dev_env_idle_check_s: float = Field(default=60.0, gt=0)
    metering_batch: int = Field(default=20_000, ge=1)
    # Earnings wait this long (for disputes) before a provider can be paid them.
    earnings_hold_s: float = Field(default=7 * 24 * 3600.0, ge=0)
    # An empty balance: running jobs get SIGTERM, then this long to save a checkpoint.
    balance_stop_grace_s: float = Field(default=60.0, ge=0, le=3600)
    # Worker processes of `sxwl serve` on one machine (docs/operations.md); `sxwl up` runs one.
    workers: int = Field(default=1, ge=1, le=256)

    # Replicas on PostgreSQL wake each other with NOTIFY (docs/replicas.md); a waiting long-poll
    # re-reads on its own only this often, against a lost notification. Longer than a hold, so an
    # idle CPod's renewal reads nothing: a deaf listener is found by its own probe within ~40 s.
    longpoll_backstop_s: float = Field(default=3600.0, gt=0)

    @field_validator("data_dir")
    @classmethod
    def _absolute_data_dir(cls, value: Path) -> Path:
        # Resolved once, here: the artifact store, the database URL and the agent that ``sxwl up``
        # starts all derive their paths from it, and none of them may depend on a working directory.
        return value.resolve()

    @field_validator("rate_login_ip", "rate_login_account", "rate_register_ip", "rate_register_account")
    @classmethod
    def _valid_rate(cls, value: str) -> str:
        parse_rate(value)
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _valid_proxies(cls, value: str) -> str:
        for item in _proxy_items(value):
            try:
                ipaddress.ip_network(item)
            except ValueError:
                raise ValueError(f"expected IP addresses or CIDR networks, got {item!r}") from None
        return value

    @property
    def artifact_served(self) -> bool:
        """Whether /downloads/3k-artifact.tgz serves an artifact (a file or an object is named)."""
        return self.artifact_file is not None or bool(self.artifact_key)

    def trusted_proxy_list(self) -> list[str]:
        return [str(ipaddress.ip_network(item)) for item in _proxy_items(self.trusted_proxies)]

    def resolved_database_url(self) -> str:
        url = self.database_url or f"sqlite:///{self.data_dir / 'sxwl.db'}"
        # Plain postgresql:// URLs are what people paste; psycopg 3 is the driver we ship.
        if url.startswith("postgresql://") or url.startswith("postgres://"):
            url = "postgresql+psycopg://" + url.split("://", 1)[1]
        return url

    def resolved_secret_key(self) -> str:
        """The configured key, else one generated once into the data dir (mode 0600)."""
        if self.secret_key:
            return self.secret_key
        path = self.data_dir / "secret.key"
        if path.exists():
            return path.read_text().strip()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        key = secrets.token_urlsafe(48)
        # Written whole under a temporary name, then linked into place: processes starting together
        # on one data dir (workers, a server and `sxwl admin`) all end up with the one key that won,
        # and none reads a file still being written.
        draft = path.with_name(f".secret.key.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(key + "\n")
            os.link(draft, path)
        except FileExistsError:
            return path.read_text().strip()
        finally:
            draft.unlink()
        return key

    # Artifacts (docs/object-storage.md): files under the data dir, or an S3-compatible bucket that
    # CPods and browsers reach at the public endpoint with presigned URLs. The bucket's keys are read
    # from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the credentials file, never kept here.
    artifact_store: Literal["local", "s3"] = "local"
    s3_endpoint: str = ""  # empty: AWS's own endpoint for the region
    s3_public_endpoint: str = ""  # empty: s3_endpoint
    s3_bucket: str = ""
    s3_region: str = "us-east-1"
    s3_credentials_file: Path | None = None
    s3_presign_expiry_s: int = Field(default=900, ge=1, le=7 * 24 * 3600)

    @model_validator(mode="after")
    def _s3_complete(self) -> Settings:
        if self.artifact_store == "s3":
            if not self.s3_bucket:
                raise ValueError("SXWL_S3_BUCKET must be set when SXWL_ARTIFACT_STORE=s3")
            if self.artifact_max_bytes > 5 * 1024**3:
                raise ValueError("SXWL_ARTIFACT_MAX_BYTES must be at most 5 GiB (one PUT) with S3")
        for name in ("s3_endpoint", "s3_public_endpoint"):
            value = getattr(self, name)
            if value and not value.startswith(("http://", "https://")):
                raise ValueError(f"SXWL_{name.upper()} must be an http(s) URL, got {value!r}")
        return self

    @model_validator(mode="after")
    def _artifact_key_usable(self) -> Settings:
        """The served artifact's key is checked at start: a wrong one would only show as 404s."""
        key = self.artifact_key
        if not key:
            return self
        if self.artifact_store != "s3":
            raise ValueError(
                "SXWL_ARTIFACT_KEY names an object in the S3 artifact store: set SXWL_ARTIFACT_STORE=s3, "
                "or name a file beside the cloud with SXWL_ARTIFACT_FILE"
            )
        if self.artifact_file is not None:
            raise ValueError("set SXWL_ARTIFACT_FILE or SXWL_ARTIFACT_KEY, not both")
        # Room is left for the served copies' keys (<key>.served/<20 hex>.tgz) within S3's 1024 bytes.
        bad = key.startswith("/") or key.endswith("/") or "//" in key or any(ord(c) < 32 for c in key)
        if bad or len(key.encode()) > 900:
            raise ValueError(
                "SXWL_ARTIFACT_KEY must be an object key such as downloads/3k-artifact.tgz (no leading, "
                f"trailing or double '/', no control characters, at most 900 bytes), got {key!r}"
            )
        return self
