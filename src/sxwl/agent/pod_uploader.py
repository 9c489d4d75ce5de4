"""The ``uploader`` container of a Kubernetes tenant pod: puts the files of the main container's
output dir to the cloud as the attempt's artifacts, with the attempt's upload token (docs/agent.md,
"Artifacts from pods"). While the main container's command runs it lists ``checkpoints/`` of the
output dir every few seconds and uploads each new checkpoint there, so that a requeued attempt can
resume from the last one even when this pod is lost; once the command has ended it uploads everything
else. Every file goes once.

It must run on any image with a ``python3``, so it is the standard library only and imports nothing
of sxwl (``python3 /path/pod_uploader.py`` works as well as ``python3 -m sxwl.agent.pod_uploader``).
Each file is read twice, never held in memory: once for its size and sha256, which it announces to
the cloud, then streamed in chunks to where the cloud answers: to the cloud itself, which stores it
only if the bytes it received hash the same, or to the object store's presigned URL, after which the
cloud checks the stored object and records it (docs/object-storage.md). What happened is written as
one line to the termination log, which the agent reads from the container's status; the exit status
is 0 whenever that line says it, so a failed upload of one rank never fails the Indexed Job and stops
the ranks still at work."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import signal
import ssl
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import BinaryIO
from urllib.parse import SplitResult, quote, urlsplit

# The same as sxwl.protocol (tests check it), which this program cannot import.
PROTOCOL_HEADER = "X-SXWL-Protocol"
SHA256_HEADER = "X-SXWL-Sha256"
UPLOAD_PATH = "/api/v1/agent/uploads/{job_id}/{attempt}/{path}"
TARGET_PATH = "/api/v1/agent/upload-targets/{job_id}/{attempt}"
DONE_PATH = TARGET_PATH + "/done"
# Files of the shared volume (the main container's wrapper writes them, kube_wrapper.py).
EXIT_CODE_FILE = "exit-code"
ALIVE_FIFO = "alive"
OUTPUT_DIR = "output"
# The trainer's checkpoints, each renamed in complete (sxwl.protocol.finetune's, tests check it).
CHECKPOINT_DIR = "checkpoints"

CHUNK = 1024 * 1024
TRIES = 5
TIMEOUT_S = 60.0
POLL_S = 0.5
LISTING_S = 5.0  # a listing is cheap and checkpoints come minutes apart: seconds late is soon enough
MESSAGE_LIMIT = 3000  # the kubelet keeps 4096 bytes of a termination message


class Fatal(Exception):
    """The cloud refuses this attempt's uploads altogether (token, stale attempt): stop."""


class Refused(Exception):
    """The cloud refused one file; the others may still go."""


class Unreachable(Refused):
    """Every try of one file met a connection error or a 5xx: while the main container runs, the next
    listing tries it again; at the end it is an error like a refusal."""


@dataclass(frozen=True)
class Config:
    url: str
    job_id: str
    attempt: int
    rank: int
    nodes: int
    token: str
    ca_file: str | None
    shared: Path
    termination_log: Path

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Config:
        token_file = Path(env.get("SXWL_UPLOAD_TOKEN_FILE", "/sxwl-upload/token"))
        ca_file = env.get("SXWL_UPLOAD_CA_FILE") or None
        return cls(
            url=env["SXWL_UPLOAD_URL"].rstrip("/"),
            job_id=env["SXWL_JOB_ID"],
            attempt=int(env["SXWL_ATTEMPT"]),
            rank=int(env.get("NODE_RANK", "0") or 0),
            nodes=int(env.get("NNODES", "1") or 1),
            token=token_file.read_text().strip(),
            ca_file=ca_file if ca_file and Path(ca_file).exists() else None,
            shared=Path(env.get("SXWL_SHARED_DIR", "/sxwl")),
            termination_log=Path(env.get("SXWL_TERMINATION_LOG", "/dev/termination-log")),
        )


@dataclass
class Summary:
    uploaded: int = 0
    bytes: int = 0
    errors: list[str] = field(default_factory=list)

    def line(self) -> str:
        done = f"{self.uploaded} file{'s' if self.uploaded != 1 else ''} ({self.bytes} bytes) uploaded"
        if not self.errors:
            return f"ok: {done}"
        return f"error: {'; '.join(self.errors)} ({done})"


# Set by SIGTERM: the pod is being deleted.
TERMINATING = threading.Event()


def wait_for_main(shared: Path, meanwhile: Callable[[], object] | None = None) -> int | None:
    """The main command's exit status once its wrapper wrote it; None when the main container ended
    without one (killed as a whole, by the OOM killer say): the wrapper holds the write end of a FIFO
    for its whole life, so an end of file says that no process of it is left. Also None at once when
    the pod is deleted before the wrapper ever ran (its container could not start). ``meanwhile`` is
    called between two looks (it uploads the checkpoints)."""
    fifo: int | None = None
    code_file = shared / EXIT_CODE_FILE
    try:
        while True:
            if code_file.exists():
                return _read_code(code_file)
            if fifo is None and TERMINATING.is_set() and not (shared / ALIVE_FIFO).exists():
                return None
            if fifo is None and (shared / ALIVE_FIFO).exists():
                fifo = os.open(shared / ALIVE_FIFO, os.O_RDONLY | os.O_NONBLOCK)
            if fifo is not None:
                try:
                    if os.read(fifo, 512) == b"":
                        return _read_code(code_file) if code_file.exists() else None
                except BlockingIOError:
                    pass  # a writer holds it: the main container lives
            if meanwhile is not None:
                meanwhile()
            time.sleep(POLL_S)
    finally:
        if fifo is not None:
            os.close(fifo)


def _read_code(path: Path) -> int | None:
    text = path.read_text().strip()
    return int(text) if text.lstrip("-").isdigit() else None


def output_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(relative POSIX path, file) for every regular file under ``root``; links (to files or dirs) and
    anything else that is not a regular file are skipped, so nothing outside ``root`` is read."""
    if not root.is_dir() or root.is_symlink():
        return
    for directory, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            path = Path(directory) / name
            if stat.S_ISREG(path.lstat().st_mode):
                yield path.relative_to(root).as_posix(), path


def checkpoint_files(output: Path) -> list[tuple[str, Path]]:
    """(relative POSIX path, file) for the complete checkpoints in ``output``'s checkpoint dir: its
    regular files but the dot-names, which are still being written. Nothing is read through a link,
    neither the dir's nor a file's; a dir not made yet has none."""
    directory = output / CHECKPOINT_DIR
    try:
        if output.is_symlink() or directory.is_symlink():
            return []
        with os.scandir(directory) as entries:
            return sorted(
                (f"{CHECKPOINT_DIR}/{entry.name}", Path(entry.path))
                for entry in entries
                if not entry.name.startswith(".") and entry.is_file(follow_symlinks=False)
            )
    except OSError:
        return []


def sha256_of(path: Path, root: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with _open_no_follow(path, root) as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _open_no_follow(path: Path, root: Path) -> BinaryIO:
    """Opens ``path``, a file under ``root``, through no link at all: each directory below ``root``
    is opened with O_NOFOLLOW from the one before. O_NOFOLLOW on the whole path guards only its last
    part, and the main container could swap a directory for a link between a listing and this open,
    making the uploader read a file of its own mount namespace (the token's, say) as an artifact."""
    *dirs, name = path.relative_to(root).parts
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in dirs:
            below = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = below
        return os.fdopen(os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd), "rb")
    finally:
        os.close(fd)


class Uploader:
    def __init__(self, config: Config) -> None:
        self.config = config
        parts = urlsplit(config.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"SXWL_UPLOAD_URL must be an http(s) URL, not {config.url!r}")
        self.scheme, self.host, self.port = parts.scheme, parts.hostname, parts.port
        self.base = parts.path.rstrip("/")
        self.tls = ssl.create_default_context(cafile=config.ca_file) if parts.scheme == "https" else None

        # The object store may be another host with a public certificate: the system's CAs and the
        # cloud's own.
        self.store_tls = ssl.create_default_context()
        if config.ca_file:
            self.store_tls.load_verify_locations(config.ca_file)

    def _connection(self, store: SplitResult | None = None) -> http.client.HTTPConnection:
        if store is not None:
            if store.scheme == "https":
                return http.client.HTTPSConnection(
                    store.hostname or "", store.port, timeout=TIMEOUT_S, context=self.store_tls
                )
            return http.client.HTTPConnection(store.hostname or "", store.port, timeout=TIMEOUT_S)
        if self.tls is not None:
            return http.client.HTTPSConnection(self.host, self.port, timeout=TIMEOUT_S, context=self.tls)
        return http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT_S)

    def put(self, name: str, path: Path) -> int:
        """Uploads one file; returns its size. Retries connection errors and 5xx with backoff."""
        delay = 1.0
        for attempt in range(1, TRIES + 1):
            # Again on every try: a retry after a mismatch rehashes.
            digest, size = sha256_of(path, self.config.shared)
            try:
                status, body = self._upload(name, path, digest, size)
            except (OSError, http.client.HTTPException) as exc:
                status, body = 0, {"message": f"{type(exc).__name__}: {exc}"}
            if status == 201:
                return size
            if status and status < 500 and status != 429:
                raise _refusal(name, status, body)
            if attempt == TRIES:
                raise Unreachable(f"artifact {name} not uploaded: {body.get('message', status)}")
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def _cloud_path(self, template: str, name: str = "") -> str:
        job_id, attempt = quote(self.config.job_id, safe=""), self.config.attempt
        return self.base + template.format(job_id=job_id, attempt=attempt, path=quote(name))

    def _upload(self, name: str, path: Path, digest: str, size: int) -> tuple[int, dict[str, object]]:
        """Asks where the bytes go and puts them there; a presigned PUT is then reported done."""
        announce = json.dumps({"path": name, "size": size, "sha256": digest}).encode()
        status, reply = self._send(
            None, "POST", self._cloud_path(TARGET_PATH), self._json_headers(), announce
        )
        if status != 200:
            return status, _error_of(reply)
        target = _json_of(reply)
        url, signed = target.get("url"), target.get("headers")
        if target.get("via") != "url" or not isinstance(url, str) or not isinstance(signed, dict):
            headers = [*self._auth(), ("Content-Type", "application/octet-stream"), (SHA256_HEADER, digest)]
            status, reply = self._send(None, "PUT", self._cloud_path(UPLOAD_PATH, name), headers, path, size)
            return status, _error_of(reply)
        store = urlsplit(url)
        headers = [(str(k), str(v)) for k, v in signed.items() if str(k).lower() != "content-length"]
        target_path = store.path + (f"?{store.query}" if store.query else "")
        status, reply = self._send(store, "PUT", target_path, headers, path, size)
        if status >= 500:
            return status, {"message": f"the object store answered HTTP {status}"}
        if status >= 300:
            code = reply.split(b"<Code>", 1)[-1].split(b"<", 1)[0].decode(errors="replace")[:100]
            raise Refused(f"artifact {name} refused by the object store: HTTP {status} {code}".rstrip())
        status, reply = self._send(None, "POST", self._cloud_path(DONE_PATH), self._json_headers(), announce)
        return status, _error_of(reply)

    def _auth(self) -> list[tuple[str, str]]:
        return [("Authorization", f"Bearer {self.config.token}"), (PROTOCOL_HEADER, "1")]

    def _json_headers(self) -> list[tuple[str, str]]:
        return [*self._auth(), ("Content-Type", "application/json")]

    def _send(
        self,
        store: SplitResult | None,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes | Path,
        size: int | None = None,
    ) -> tuple[int, bytes]:
        """One request, to the cloud (``store`` None) or the object store; a file body streams."""
        connection = self._connection(store)
        try:
            connection.putrequest(method, target, skip_accept_encoding=True)
            length = len(body) if isinstance(body, bytes) else size
            for header, value in (*headers, ("Content-Length", str(length))):
                connection.putheader(header, value)
            connection.endheaders()
            try:
                if isinstance(body, bytes):
                    connection.send(body)
                else:
                    with _open_no_follow(body, self.config.shared) as handle:
                        while chunk := handle.read(CHUNK):
                            connection.send(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered before reading it all (too large, say): read why
            response = connection.getresponse()
            raw = response.read(64 * 1024)
        finally:
            connection.close()
        return response.status, raw


def _json_of(raw: bytes) -> dict[str, object]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _error_of(raw: bytes) -> dict[str, object]:
    error = _json_of(raw).get("error", {})
    return error if isinstance(error, dict) else {}


def _refusal(name: str, status: int, error: dict[str, object]) -> Exception:
    """A 4xx as words for the job's reason; those that end every upload of the attempt are Fatal."""
    details = error.get("details")
    if status == 413 and isinstance(details, dict) and "max_bytes" in details:
        return Refused(f"artifact {name} refused: larger than {details['max_bytes']} bytes")
    message = str(error.get("message") or f"HTTP {status}")
    if status in (401, 403) or error.get("code") in ("stale_attempt", "upload_closed"):
        return Fatal(f"artifacts refused by the cloud: {message}")
    return Refused(f"artifact {name} refused: {message}")


class Artifacts:
    """What one uploader sends: the checkpoints while the main container runs, then the rest of the
    output. A file is sent once, and the summary counts every file sent, early or at the end."""

    def __init__(self, config: Config) -> None:
        self.uploader = Uploader(config)
        self.output = config.shared / OUTPUT_DIR
        self.prefix = f"rank-{config.rank}/" if config.nodes > 1 else ""
        self.summary = Summary()
        self.settled: set[str] = set()  # sent, refused or gone: never tried again
        self.stopped = False  # a Fatal refusal: the cloud takes nothing more of this attempt
        self.next_listing = 0.0

    def checkpoints(self) -> None:
        """Sends the checkpoints that appeared since the last listing, at most one listing each
        ``LISTING_S``."""
        if self.stopped or time.monotonic() < self.next_listing:
            return
        self.next_listing = time.monotonic() + LISTING_S
        for name, path in checkpoint_files(self.output):
            if name not in self.settled and not self.stopped:
                self._send(name, path, final=False)

    def rest(self) -> Summary:
        """Sends every file not sent yet, once the main container has ended."""
        for name, path in output_files(self.output):
            if self.stopped:
                break
            if name not in self.settled:
                self._send(name, path, final=True)
        return self.summary

    def _send(self, name: str, path: Path, final: bool) -> None:
        artifact = self.prefix + name
        try:
            self.summary.bytes += self.uploader.put(artifact, path)
            self.summary.uploaded += 1
        except Unreachable as exc:
            if not final:
                return  # the cloud may be back by the next listing, or by the end
            self.summary.errors.append(str(exc))
        except Refused as exc:
            self.summary.errors.append(str(exc))
        except Fatal as exc:
            self.summary.errors.append(str(exc))
            self.stopped = True
        except OSError as exc:  # the file went away or cannot be read
            if not final and not isinstance(exc, FileNotFoundError):
                return  # unreadable to this user until the wrapper opens the output up at the end
            self.summary.errors.append(f"artifact {artifact} not uploaded: {exc.strerror or exc}")
        self.settled.add(name)


def _terminating(signum: int, frame: FrameType | None) -> None:
    """The pod is being deleted: the main container got SIGTERM too and may be saving a checkpoint,
    so keep waiting for it and upload what it leaves, until the grace ends with SIGKILL."""
    TERMINATING.set()
    print("SIGTERM: uploading what the main container leaves, within the grace", file=sys.stderr)


def main() -> int:
    signal.signal(signal.SIGTERM, _terminating)
    env = dict(os.environ)
    log_path = Path(env.get("SXWL_TERMINATION_LOG", "/dev/termination-log"))
    try:
        config = Config.from_env(env)
        artifacts = Artifacts(config)
        code = wait_for_main(config.shared, artifacts.checkpoints)
        line = artifacts.rest().line()
        if code is None:
            line += "; the main container ended without an exit status"
    except (KeyError, ValueError, OSError) as exc:
        line = f"error: the uploader could not run: {type(exc).__name__}: {exc}"
    print(line, file=sys.stderr)
    try:
        log_path.write_text(line[:MESSAGE_LIMIT])
    except OSError as exc:
        print(f"cannot write {log_path}: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
