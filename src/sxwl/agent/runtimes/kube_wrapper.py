"""The POSIX sh wrapper around a Kubernetes job's command, so that the ``uploader`` container
(``sxwl.agent.pod_uploader``) knows when the command has ended and how.

The wrapper runs the command as its child and waits for it; SIGTERM (a cancel, a stop, the pod's
deletion) is passed on to the child at once, so a training script still saves its checkpoint. SIGINT
is passed on as SIGTERM: a POSIX shell starts its background child with SIGINT ignored, and a child
cannot take back what it inherited ignored (Python does not). When the child has ended, the output
dir is made readable to the uploader (which runs as another user), the exit status is written to
``exit-code`` (a rename: never half a file), and the wrapper exits with that same status, so
Kubernetes shows the real exit code and its own reasons (OOMKilled, Error) as before.

For the whole of its life the wrapper holds the write end of the FIFO ``alive``: when the container
is killed as a whole (the OOM killer, with memory.oom.group) no exit status is written, and the
uploader learns it from the FIFO's end of file. The FIFO is made under another name and renamed once
the wrapper holds it open, so the uploader never sees it without its writer (an end of file at once)."""

from __future__ import annotations

SHARED_DIR = "/sxwl"
WRAPPER_NAME = "sxwl-wrapper"  # the wrapper's $0: the user's command follows it
OUTPUT_DIR = SHARED_DIR + "/output"

WRAPPER = r"""
d="${SXWL_SHARED_DIR:-/sxwl}"
mkdir -p "$SXWL_OUTPUT_DIR" 2>/dev/null
rm -f "$d/alive" "$d/.alive" "$d/exit-code" 2>/dev/null
if mkfifo "$d/.alive" 2>/dev/null; then exec 9<>"$d/.alive"; mv -f "$d/.alive" "$d/alive"; fi
child=
sig=
trap 'sig=TERM; [ -n "$child" ] && kill -TERM "$child" 2>/dev/null' TERM INT
"$@" 9>&- &
child=$!
[ -n "$sig" ] && kill -TERM "$child" 2>/dev/null
while :; do
    wait "$child"
    code=$?
    kill -0 "$child" 2>/dev/null || break
done
chmod -R a+rX "$SXWL_OUTPUT_DIR" 2>/dev/null
printf '%s\n' "$code" >"$d/.exit-code" && mv -f "$d/.exit-code" "$d/exit-code"
exit "$code"
"""


def wrapped(command: list[str] | str) -> list[str]:
    """The container command that runs ``command`` under the wrapper: a string as ``/bin/sh -c``, a
    list exactly as given."""
    argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    return ["/bin/sh", "-c", WRAPPER, WRAPPER_NAME, *argv]
