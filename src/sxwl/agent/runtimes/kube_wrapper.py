"""The POSIX sh wrapper around a Kubernetes job's command, so that the ``uploader`` container
(``sxwl.agent.pod_uploader``) knows when the command has ended and how.

The wrapper runs the command as its child and waits for it; SIGTERM (a cancel, a stop, the pod's
deletion) is passed on to the child at once, so a training script still saves its checkpoint. SIGINT
is passed on as SIGTERM: a POSIX shell starts its background child with SIGINT ignored, and a child
cannot take back what it inherited ignored (Python does not). When the child has ended, the output
dir is made readable to the uploader (which runs as another user), the exit status is written to
``exit-code`` (a rename: never half a file), and the wrapper exits with that same status, so
Kubernetes shows the real exit code and its own reasons (OOMKilled, Error) as before. When the
command's status is 127 and its program (the first word of a shell string) is not on PATH, the
wrapper adds the line the local sandbox writes, ``command not found: python (on PATH: python3)``,
naming the versions that are: the agent takes them into the reason (agent/not_found.py).

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
if [ "$code" = 127 ]; then
    if [ "$1" = /bin/sh ] && [ "$2" = -c ]; then w=${3%%[!A-Za-z0-9._+-]*}; else w=$1; fi
    case "$w" in ''|*/*) w= ;; esac
    if [ -n "$w" ] && ! command -v "$w" >/dev/null 2>&1; then
        found= n=0
        IFS=:
        for dir in $PATH; do
            for f in "${dir:-.}/$w"[0-9]*; do
                v=${f##*/}
                case "${v#"$w"}" in *[!0-9.]*) continue ;; esac
                case ", $found, " in *", $v, "*) continue ;; esac
                [ -x "$f" ] && [ "$n" -lt 4 ] || continue
                found="${found:+$found, }$v" n=$((n + 1))
            done
        done
        unset IFS
        [ -n "$found" ] && printf 'command not found: %s (on PATH: %s)\n' "$w" "$found" >&2
    fi
fi
chmod -R a+rX "$SXWL_OUTPUT_DIR" 2>/dev/null
printf '%s\n' "$code" >"$d/.exit-code" && mv -f "$d/.exit-code" "$d/exit-code"
exit "$code"
"""


def wrapped(command: list[str] | str) -> list[str]:
    """The container command that runs ``command`` under the wrapper: a string as ``/bin/sh -c``, a
    list exactly as given."""
    argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    return ["/bin/sh", "-c", WRAPPER, WRAPPER_NAME, *argv]
