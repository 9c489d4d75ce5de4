"""The ``inputs`` init container of a fine-tune's Kubernetes pod: fetches every input of its attempt
(the base model's tar, the training and validation files, the checkpoint it resumes from) with the
attempt's upload token, and leaves each read-only in the inputs dir that the main container mounts
(docs/agent.md, "Fine-tunes on Kubernetes").

It must run on any image with a ``python3``, Debian bookworm's 3.11.2 included (which has no tarfile
``data`` filter), so it is the standard library only and imports nothing of sxwl (``python3 -I
/sxwl-upload/pod_fetcher.py``). Each input streams to a temporary file in the inputs dir, hashed as
it arrives, and is kept only if its size and sha256 are those of the assignment. With
SXWL_INPUTS_CACHE_URL it is asked first, once, of the CPod's input cache (the agent's
cache_server.py, with ``cache_credential``, never the token itself); whatever goes wrong there falls
back to the cloud, the authority on what the attempt may have, whose redirect to the object store's
presigned URL is followed once, without the token. A model's tar is unpacked here, member by member
(regular files and directories only), into a staging dir renamed into place, so the main container
never sees half a tree; the ``resume`` checkpoint stays the tar the trainer unpacks itself. Last the
``TrainerRun`` (SXWL_TRAINER_RUN) is written beside the inputs.

What happened is one line in the termination log, which the agent makes the job's reason; the exit
status is 1 on any error, which fails the pod before the trainer starts. The first failed input ends
the fetch. SXWL_FETCH_RETRY_S sets the first delay between tries of the cloud (default 1 s, doubled
each time; tests make it small)."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import ssl
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import BinaryIO
from urllib.parse import SplitResult, quote, urljoin, urlsplit

# The same as sxwl.protocol (tests check it), which this program cannot import.
PROTOCOL_HEADER = "X-SXWL-Protocol"
SHA256_HEADER = "X-SXWL-Sha256"
INPUT_PATH = "/api/v1/agent/pod-inputs/{job_id}/{attempt}/{name}"
CACHE_PATH = "/v1/inputs/{job_id}/{attempt}/{sha256}"
CACHE_CREDENTIAL = b"sxwl-input-cache\0"
RUN_FILE = "trainer-run.json"
# Unpacked by the trainer itself (it wrote it), so it stays a tar.
RESUME = "resume"
# A run killed half-way leaves only names with it, which the next run of the init container removes.
TEMP_PREFIX = ".sxwl-fetch-"

CHUNK = 1024 * 1024
TRIES = 5
RETRY_S = 1.0
TIMEOUT_S = 60.0
# What the main container gets: it reads every input and changes none.
READ_ONLY_FILE = 0o444
READ_ONLY_DIR = 0o555
MESSAGE_LIMIT = 3000  # the kubelet keeps 4096 bytes of a termination message
REDIRECTS = (302, 303, 307)
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class FetchError(Exception):
    """An input that cannot be had (refused, or wrong on every try); the message names it."""


class ArchiveError(ValueError):
    """A tar member that is not a regular file or directory, or whose name leaves the archive."""


class Stopped(BaseException):
    """SIGTERM: the pod is being deleted. Not an Exception, so no handler of errors takes it."""


@dataclass(frozen=True)
class Input:
    name: str
    sha256: str
    size: int
    archive: bool

    @classmethod
    def parse(cls, value: object) -> Input:
        if not isinstance(value, dict):
            raise ValueError(f"SXWL_INPUTS: each input must be an object, not {value!r}")
        name, sha256, size = value.get("name"), value.get("sha256"), value.get("size")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"SXWL_INPUTS: {name!r} is not an input name")
        if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            raise ValueError(f"SXWL_INPUTS: input {name}: sha256 must be 64 lowercase hex digits")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"SXWL_INPUTS: input {name}: size must be a whole number of bytes")
        return cls(name, sha256, size, value.get("archive") is True)

    def unpacks(self) -> bool:
        return self.archive and self.name != RESUME


@dataclass(frozen=True)
class Config:
    url: str
    job_id: str
    attempt: int
    token: str
    ca_file: str | None
    inputs_dir: Path
    inputs: list[Input]
    trainer_run: str | None
    retry_s: float
    cache_url: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Config:
        token_file = Path(env.get("SXWL_UPLOAD_TOKEN_FILE", "/sxwl-upload/token"))
        ca_file = env.get("SXWL_UPLOAD_CA_FILE") or None
        listed = json.loads(env["SXWL_INPUTS"])
        if not isinstance(listed, list):
            raise ValueError("SXWL_INPUTS must be a JSON list")
        return cls(
            url=env["SXWL_UPLOAD_URL"].rstrip("/"),
            job_id=env["SXWL_JOB_ID"],
            attempt=int(env["SXWL_ATTEMPT"]),
            token=token_file.read_text().strip(),
            ca_file=ca_file if ca_file and Path(ca_file).exists() else None,
            inputs_dir=Path(env.get("SXWL_INPUTS_DIR", "/sxwl-inputs")),
            inputs=[Input.parse(item) for item in listed],
            trainer_run=env.get("SXWL_TRAINER_RUN") or None,
            retry_s=float(env.get("SXWL_FETCH_RETRY_S", RETRY_S)),
            cache_url=env.get("SXWL_INPUTS_CACHE_URL") or None,
        )


class Fetcher:
    def __init__(self, config: Config) -> None:
        self.config = config
        parts = urlsplit(config.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"SXWL_UPLOAD_URL must be an http(s) URL, not {config.url!r}")
        self.cloud = parts
        self.cache = urlsplit(config.cache_url) if config.cache_url else None
        if self.cache is not None and (self.cache.scheme != "http" or not self.cache.hostname):
            raise ValueError(f"SXWL_INPUTS_CACHE_URL must be an http URL, not {config.cache_url!r}")
        self.tls = ssl.create_default_context(cafile=config.ca_file) if parts.scheme == "https" else None
        # The object store may be another host with a public certificate: the system's CAs too.
        self.store_tls = ssl.create_default_context()
        if config.ca_file:
            self.store_tls.load_verify_locations(config.ca_file)

    def fetch(self, item: Input) -> str:
        """Fetches, checks and places one input; where it came from. From the cloud, connection
        errors, 5xx, 429 and bytes that are not the expected ones are tried again with backoff; any
        other refusal is final at once."""
        if self.cache is not None:
            why = self._into_place(item, self._try_cache)
            if why is None:
                return "the CPod's cache"
            print(f"input {item.name}: not from the CPod's cache ({why}); from the cloud", file=sys.stderr)
        delay = self.config.retry_s
        for attempt in range(1, TRIES + 1):
            why = self._into_place(item, self._try)
            if why is None:
                return "the cloud"
            if attempt == TRIES:
                raise FetchError(f"input {item.name}: not fetched in {TRIES} tries: {why}")
            print(f"input {item.name}: try {attempt} failed ({why}); again in {delay:g} s", file=sys.stderr)
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def _into_place(self, item: Input, get: Callable[[Input, BinaryIO], str | None]) -> str | None:
        """One try of ``get`` into a temporary file, placed when its bytes are the input's; else why not."""
        handle, name = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{item.name}.", dir=self.config.inputs_dir)
        temp = Path(name)
        try:
            try:
                with os.fdopen(handle, "wb") as out:
                    why = get(item, out)
            except (OSError, http.client.HTTPException) as exc:
                why = f"{type(exc).__name__}: {exc}"
            if why is None:
                place(item, temp, self.config.inputs_dir)
            return why
        finally:
            temp.unlink(missing_ok=True)

    def _try_cache(self, item: Input, out: BinaryIO) -> str | None:
        assert self.cache is not None
        job_id, attempt = quote(self.config.job_id, safe=""), self.config.attempt
        target = self.cache.path + CACHE_PATH.format(job_id=job_id, attempt=attempt, sha256=item.sha256)
        auth = {"Authorization": f"Bearer {cache_credential(self.config.token)}"}
        connection, response = self._get(self.cache, target, auth)
        try:
            if response.status != 200:
                return f"HTTP {response.status}"
            size, digest = _save(response, out, item.size)
        finally:
            connection.close()
        return _mismatch(item, size, digest)

    def _try(self, item: Input, out: BinaryIO) -> str | None:
        """One try, its bytes written to ``out``: None when they are the input's, otherwise why this
        try failed (worth another). Raises FetchError for a refusal that another try would repeat."""
        job_id, name = quote(self.config.job_id, safe=""), quote(item.name, safe="")
        path = self.cloud.path + INPUT_PATH.format(job_id=job_id, attempt=self.config.attempt, name=name)
        auth = {"Authorization": f"Bearer {self.config.token}", PROTOCOL_HEADER: "1"}
        connection, response = self._get(self.cloud, path, auth)
        try:
            if response.status in REDIRECTS:
                location = response.getheader("Location") or ""
                connection.close()
                store = urlsplit(urljoin(self.config.url + "/", location))
                if not location or store.scheme not in ("http", "https"):
                    raise FetchError(f"input {item.name}: redirected to {location!r}, not an http(s) URL")
                # The presigned URL is its own credential: the token never goes to the store.
                target = store.path + (f"?{store.query}" if store.query else "")
                connection, response = self._get(store, target, {})
                if response.status != 200:
                    return _store_failure(item, response)
            elif response.status != 200:
                return _cloud_failure(item, response)
            size, digest = _save(response, out, item.size)
        finally:
            connection.close()
        return _mismatch(item, size, digest)

    def _get(
        self, where: SplitResult, target: str, headers: dict[str, str]
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        host, port = where.hostname or "", where.port
        connection: http.client.HTTPConnection
        if where.scheme == "https":
            tls = self.tls if where is self.cloud else self.store_tls
            connection = http.client.HTTPSConnection(host, port, timeout=TIMEOUT_S, context=tls)
        else:
            connection = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
        try:
            connection.request("GET", target or "/", headers=headers)
            return connection, connection.getresponse()
        except BaseException:
            connection.close()
            raise


def cache_credential(upload_token: str) -> str:
    """What a pod shows the CPod's input cache: derived from the upload token, so the cache (plain
    HTTP inside the cluster) never sees the token that reaches the cloud."""
    return hashlib.sha256(CACHE_CREDENTIAL + upload_token.encode()).hexdigest()


def _mismatch(item: Input, size: int, digest: str) -> str | None:
    if size > item.size:
        return f"more than the expected {item.size} bytes arrived"
    if size != item.size:
        return f"{size} bytes arrived, not the expected {item.size}"
    if digest != item.sha256:
        return f"sha256 {digest} is not the expected {item.sha256}"
    return None


def _save(response: http.client.HTTPResponse, out: BinaryIO, expected: int) -> tuple[int, str]:
    """(size, sha256) of the body, written to ``out``; past ``expected`` bytes it stops reading, so a
    wrong answer cannot fill the disk."""
    digest, size = hashlib.sha256(), 0
    while chunk := response.read(CHUNK):
        size += len(chunk)
        if size > expected:
            break
        digest.update(chunk)
        out.write(chunk)
    return size, digest.hexdigest()


def _cloud_failure(item: Input, response: http.client.HTTPResponse) -> str:
    """Why the cloud did not answer the bytes: a reason to try again (5xx, 429), or FetchError."""
    raw = response.read(64 * 1024)
    try:
        body = json.loads(raw)
    except ValueError:
        body = {}
    error = body.get("error") if isinstance(body, dict) else None
    message = str(error.get("message") or "") if isinstance(error, dict) else ""
    status = response.status
    if status >= 500 or status == 429:
        return f"the cloud answered HTTP {status}" + (f": {message}" if message else "")
    # 401, 403 (a token refused) and 409 (a stale or ended attempt) end the attempt's every input,
    # 404 this one; either way the pod cannot start.
    raise FetchError(
        f"input {item.name}: refused by the cloud (HTTP {status}): {message or 'no reason given'}"
    )


def _store_failure(item: Input, response: http.client.HTTPResponse) -> str:
    status = response.status
    if status >= 500 or status == 429:
        return f"the object store answered HTTP {status}"
    raw = response.read(64 * 1024)
    code = raw.partition(b"<Code>")[2].split(b"<", 1)[0][:100].decode(errors="replace")
    raise FetchError(f"input {item.name}: refused by the object store: HTTP {status} {code}".rstrip())


def place(item: Input, temp: Path, inputs_dir: Path) -> None:
    """Puts the checked download in place read-only: a file as it is, an archive unpacked."""
    final = inputs_dir / item.name
    remove(final)  # a rerun of the init container (its pod restarted it) finds its earlier result
    if not item.unpacks():
        temp.chmod(READ_ONLY_FILE)
        os.replace(temp, final)
        return
    staging = inputs_dir / f"{TEMP_PREFIX}{item.name}.d"
    remove(staging)
    try:
        unpack(temp, staging)
        read_only(staging)
        staging.rename(final)
    except (OSError, tarfile.TarError, ArchiveError) as exc:
        raise FetchError(f"input {item.name}: cannot unpack the archive: {exc}") from None
    finally:
        remove(staging)


def unpack(archive: Path, into: Path) -> None:
    """Unpacks the tar ``archive`` into the new directory ``into``, writing every file itself (never
    tarfile's extract, which 3.11.2 does not filter): only regular files and directories, no absolute
    names, none with ``..``, no links or devices; otherwise ArchiveError, and what was written stays
    for the caller to remove. Modes, owners and times in the archive are ignored."""
    into.mkdir(mode=0o700)
    with tarfile.open(archive) as tar:
        for member in tar:
            parts = _member_parts(member.name)
            target = into.joinpath(*parts)
            try:
                if member.isdir():
                    target.mkdir(mode=0o700, parents=True, exist_ok=True)
                elif member.isreg():
                    if not parts:
                        raise ArchiveError(f"{member.name!r} is a file without a name")
                    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                    source = tar.extractfile(member)
                    if source is None:
                        raise ArchiveError(f"{member.name!r} has no data")
                    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                    with source, os.fdopen(os.open(target, flags, 0o600), "wb") as out:
                        shutil.copyfileobj(source, out, CHUNK)
                else:
                    raise ArchiveError(
                        f"{member.name!r} is {_kind(member)}; only regular files and directories are allowed"
                    )
            except (FileExistsError, NotADirectoryError):
                raise ArchiveError(f"{member.name!r} clashes with another member of the archive") from None


def _member_parts(name: str) -> tuple[str, ...]:
    if name.startswith("/"):
        raise ArchiveError(f"{name!r} is an absolute name")
    parts = tuple(part for part in name.split("/") if part not in ("", "."))
    if ".." in parts:
        raise ArchiveError(f"{name!r} leaves the archive (..)")
    return parts


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym() or member.islnk():
        return f"a {'symbolic' if member.issym() else 'hard'} link to {member.linkname!r}"
    return "a device or a FIFO" if member.isdev() else f"of tar type {member.type!r}"


def read_only(root: Path) -> None:
    """Files 0444, directories 0555, the root's included; bottom up, so every directory is still
    writable while its entries change."""
    for directory, dirs, files in os.walk(root, topdown=False):
        for name in files:
            os.chmod(os.path.join(directory, name), READ_ONLY_FILE)
        for name in dirs:
            os.chmod(os.path.join(directory, name), READ_ONLY_DIR)
    os.chmod(root, READ_ONLY_DIR)


def remove(path: Path) -> None:
    """Removes a file or a tree, read-only directories included; nothing there is no error."""
    if path.is_dir() and not path.is_symlink():
        for directory, _, _ in os.walk(path):
            os.chmod(directory, 0o700)
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def write_run(inputs_dir: Path, text: str) -> None:
    handle, name = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{RUN_FILE}.", dir=inputs_dir)
    with os.fdopen(handle, "w") as out:
        out.write(text)
    os.chmod(name, READ_ONLY_FILE)
    os.replace(name, inputs_dir / RUN_FILE)


def fetch_all(config: Config) -> str:
    """Every input in place, then the run file; the result line."""
    for leftover in config.inputs_dir.iterdir():
        if leftover.name.startswith(TEMP_PREFIX):
            remove(leftover)
    fetcher = Fetcher(config)
    cached = 0
    for item in config.inputs:
        source = fetcher.fetch(item)
        cached += source == "the CPod's cache"
        print(f"input {item.name}: {item.size} bytes fetched from {source}", file=sys.stderr)
    if config.trainer_run is not None:
        write_run(config.inputs_dir, config.trainer_run)
    count, total = len(config.inputs), sum(item.size for item in config.inputs)
    line = f"ok: {count} input{'s' if count != 1 else ''} ({total} bytes) fetched"
    return line + (f", {cached} from the CPod's cache" if fetcher.cache is not None else "")


def _stop(signum: int, frame: FrameType | None) -> None:
    """The pod is being deleted: nothing will read the inputs, so stop at once (a second SIGTERM
    must not interrupt the clean-up this starts)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Stopped


def main() -> int:
    signal.signal(signal.SIGTERM, _stop)
    env = dict(os.environ)
    log_path = Path(env.get("SXWL_TERMINATION_LOG", "/dev/termination-log"))
    try:
        line = fetch_all(Config.from_env(env))
    except FetchError as exc:
        line = f"error: {exc}"
    except Stopped:
        line = "error: stopped (the pod is being deleted)"
    except (KeyError, ValueError, OSError) as exc:
        line = f"error: the fetcher could not run: {type(exc).__name__}: {exc}"
    print(line, file=sys.stderr)
    try:
        log_path.write_text(line[:MESSAGE_LIMIT])
    except OSError as exc:
        print(f"cannot write {log_path}: {exc}", file=sys.stderr)
    return 0 if line.startswith("ok: ") else 1


if __name__ == "__main__":
    sys.exit(main())
