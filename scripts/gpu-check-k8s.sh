#!/usr/bin/env bash
# gpu-check-k8s.sh: does a training job on a Kubernetes CPod get an NVIDIA GPU and use CUDA? For a
# machine with an NVIDIA GPU and a (single-node) Kubernetes cluster with the NVIDIA device plugin;
# no network access needed. Normally started through `gpu-check.sh k8s`, which sets up the venv.
#
# Usage:
#   gpu-check-k8s.sh --venv PATH --image IMAGE [--kubeconfig FILE] [--example DIR]
#                    [--node NAME] [--timeout SECONDS] [--check-only] [--keep]
#
#   --venv        a virtualenv with sxwl installed (sxwl, sxwl-agent, kubernetes_asyncio)
#   --image       the job's image: python3 with PyTorch built for CUDA (say nvcr.io/nvidia/pytorch),
#                 already in the node's containerd or in a registry the node reaches
#   --kubeconfig  default: $KUBECONFIG, else ~/.kube/config; cluster-admin (the check makes and
#                 deletes its own namespaces)
#   --example     examples/tiny-lm (default: beside this script in a checkout, or DIR/tiny-lm as
#                 `gpu-check.sh prepare DIR` leaves it)
#   --node        the GPU node to run on (default: the first Ready, untainted one with a GPU)
#   --timeout     the whole check, from start to summary (default 600, or GPU_CHECK_TIMEOUT_S)
#   --check-only  only the prerequisites
#   --keep        keep the logs and the namespaces it made
#
# First the prerequisites, all of them, each missing one with what to do: the venv, the example,
# --image, nvidia-smi listing a GPU, kubectl, the kubeconfig, the API's /readyz, a Ready node with
# allocatable nvidia.com/gpu (the device plugin), no taint that tenant pods would need to tolerate
# (a single-node kubeadm cluster's control-plane taint, say), and the nvidia.com/gpu.product label
# (GPU Feature Discovery) that jobs are placed by; whether the image is on the node (crictl or ctr, if present).
# Then, for real: `sxwl serve` on loopback (throwaway SQLite data dir, billing off), a provider and
# a user, `sxwl-agent --runtime kubernetes` in a namespace of its own with the provider's accessKey
# in SXWL_ACCESS_KEY, and the user submits examples/tiny-lm (its script and text carried in the
# command) with gpus_per_node 1 through POST /api/v1/jobs. It asserts: the job succeeds, its pod's
# limits ask for nvidia.com/gpu: 1, its log says "tiny-lm torch GPT on cuda" (the backend tiny-lm
# chose: torch only when CUDA is available), and a checkpoint artifact downloads with the size and
# sha256 it is listed with. Everything it started is stopped by pid, and its namespaces deleted.
#
# Exit status: 0 every check passed; 1 a check failed; 2 wrong usage; 3 a prerequisite is missing
# (nothing was started).
set -euo pipefail

PROG=$(basename "$0")
HERE=$(cd "$(dirname "$0")" && pwd)
exec 3>&2
say() { printf '%s\n' "$*"; }
warn() { printf '%s: %s\n' "$PROG" "$*" >&3; }
usage() {
  sed -n '2,/^set -euo/p' "$HERE/$PROG" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

VENV="" IMAGE="" NODE_WANTED="" KUBECONFIG_FILE=${KUBECONFIG:-$HOME/.kube/config} EXAMPLE="" CHECK_ONLY=0 KEEP=0
TIMEOUT_S=${GPU_CHECK_TIMEOUT_S:-600}
while [ $# -gt 0 ]; do
  case $1 in
    --venv) [ $# -ge 2 ] || usage; VENV=$2; shift 2 ;;
    --image) [ $# -ge 2 ] || usage; IMAGE=$2; shift 2 ;;
    --kubeconfig) [ $# -ge 2 ] || usage; KUBECONFIG_FILE=$2; shift 2 ;;
    --example) [ $# -ge 2 ] || usage; EXAMPLE=$2; shift 2 ;;
    --node) [ $# -ge 2 ] || usage; NODE_WANTED=$2; shift 2 ;;
    --timeout) [ $# -ge 2 ] || usage; TIMEOUT_S=$2; shift 2 ;;
    --check-only) CHECK_ONLY=1; shift ;;
    --keep) KEEP=1; shift ;;
    -h | --help) usage ;;
    *) warn "unknown argument $1"; usage ;;
  esac
done
[ -n "$VENV" ] || usage
case $TIMEOUT_S in '' | *[!0-9]*) warn "--timeout takes whole seconds, got '$TIMEOUT_S'"; usage ;; esac
DEADLINE=$((SECONDS + TIMEOUT_S))

RESULTS=()  # "PASS what" / "FAIL what", printed as the summary however the script ends
pass() { RESULTS+=("PASS $*"); say "PASS $*"; }
fail() { RESULTS+=("FAIL $*"); say "FAIL $*"; }
MISSING=()
missing() { MISSING+=("$*"); }

# ---- prerequisites -----------------------------------------------------------------------------

PY=$VENV/bin/python
if [ ! -x "$PY" ] || [ ! -x "$VENV/bin/sxwl" ] || [ ! -x "$VENV/bin/sxwl-agent" ]; then
  missing "the venv $VENV has no sxwl and sxwl-agent: pip install sxwl into it (gpu-check.sh k8s DIR does, offline)"
elif ! "$PY" -c 'import httpx, kubernetes_asyncio' 2>/dev/null; then
  missing "the venv $VENV lacks httpx or kubernetes_asyncio: reinstall sxwl with its dependencies"
fi
if [ -z "$EXAMPLE" ]; then
  for candidate in "$HERE/../examples/tiny-lm" "$HERE/tiny-lm"; do
    [ -f "$candidate/train.py" ] && EXAMPLE=$candidate && break
  done
fi
if [ -z "$EXAMPLE" ] || [ ! -f "$EXAMPLE/train.py" ] || [ ! -f "$EXAMPLE/input.txt" ]; then
  missing "examples/tiny-lm (train.py, input.txt) not found: give --example DIR, or run from a checkout"
fi
[ -n "$IMAGE" ] || missing "no --image: name an image with python3 and PyTorch for CUDA that the node has or can pull"

PRODUCT=""
if ! command -v nvidia-smi >/dev/null; then
  missing "nvidia-smi not found: this machine needs an NVIDIA GPU with its driver"
elif ! PRODUCT=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1) || [ -z "$PRODUCT" ]; then
  missing "nvidia-smi lists no GPU ($(nvidia-smi 2>&1 | head -n 1)): repair the driver"
else
  PRODUCT=$(printf '%s' "$PRODUCT" | tr -s ' ' '-')  # as GPU Feature Discovery names it
fi

kube() { timeout 30 kubectl --kubeconfig "$KUBECONFIG_FILE" --request-timeout=20s "$@"; }
NODE=""
api_ok=0
if ! command -v kubectl >/dev/null; then
  missing "kubectl not found: install it (Debian: kubernetes-client) or put it on PATH"
elif [ ! -f "$KUBECONFIG_FILE" ]; then
  missing "no kubeconfig at $KUBECONFIG_FILE: give --kubeconfig or set KUBECONFIG (a single-node cluster: kubeadm, k3s, or the test cluster of docs/k8s-testing.md)"
elif ! readyz=$(kube get --raw /readyz 2>&1); then
  missing "the Kubernetes API of $KUBECONFIG_FILE does not answer /readyz: $(printf '%s' "$readyz" | tail -n 1)"
else
  api_ok=1
fi
if [ "$api_ok" -eq 1 ] && [ -x "$PY" ]; then
  # The node the job is to run on (--node, else the first that can take it) and its product label;
  # otherwise what keeps each GPU node from taking a tenant's pod.
  pick_node=$(cat <<'EOF'
import json, sys
wanted, fallback = sys.argv[1], sys.argv[2] or "<product>"
problems, gpu_nodes = [], 0
for n in json.load(sys.stdin)["items"]:
    name, spec, status = n["metadata"]["name"], n.get("spec", {}), n.get("status", {})
    if (wanted and name != wanted) or status.get("allocatable", {}).get("nvidia.com/gpu", "0") in ("", "0"):
        continue
    gpu_nodes += 1
    product = n["metadata"].get("labels", {}).get("nvidia.com/gpu.product")
    taints = [t for t in spec.get("taints", []) if t.get("effect") in ("NoSchedule", "NoExecute")]
    if not any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])):
        problems.append(f"node {name} is not Ready (kubectl describe node {name})")
    elif spec.get("unschedulable"):
        problems.append(f"node {name} is cordoned: kubectl uncordon {name}")
    elif taints:
        fixes = "; ".join(f"kubectl taint node {name} {t['key']}:{t['effect']}-" for t in taints)
        problems.append(f"node {name} has taints that tenant pods do not tolerate: {fixes}")
    elif not product:
        problems.append(f"node {name} has no nvidia.com/gpu.product label, which jobs are placed by: run "
                        f"GPU Feature Discovery, or: kubectl label node {name} nvidia.com/gpu.product={fallback}")
    else:
        print("OK", name, product)
        sys.exit(0)
if not gpu_nodes:
    where = f"node {wanted} has" if wanted else "no node has"
    problems.append(f"{where} allocatable nvidia.com/gpu: install the NVIDIA container toolkit (containerd's "
                    "runtime) and the NVIDIA device plugin DaemonSet (github.com/NVIDIA/k8s-device-plugin)")
for problem in problems:
    print("MISSING", problem)
EOF
  )
  if ! nodes=$(kube get nodes -o json 2>&1); then
    missing "kubectl get nodes failed: $(printf '%s' "$nodes" | tail -n 1)"
  else
    while read -r verdict rest; do
      case $verdict in
        OK) NODE=${rest%% *} PRODUCT=${rest#* } ;;
        MISSING) missing "$rest" ;;
      esac
    done < <(printf '%s' "$nodes" | "$PY" -c "$pick_node" "$NODE_WANTED" "$PRODUCT")
  fi
fi

say "== prerequisites =="
if [ -n "$IMAGE" ]; then
  # Offline the image must already be on the node; this can be checked only where the node is this machine.
  if command -v crictl >/dev/null; then
    if crictl inspecti "$IMAGE" >/dev/null 2>&1; then say "image $IMAGE is on this node (crictl)"; else
      say "note: crictl does not list $IMAGE on this node: the pod pulls it (offline: import it first, ctr -n k8s.io images import FILE)"; fi
  elif command -v ctr >/dev/null && ctr -n k8s.io images ls -q 2>/dev/null | grep -Fxq "$IMAGE"; then
    say "image $IMAGE is on this node (ctr)"
  else
    say "note: cannot tell whether $IMAGE is on the node (no crictl; ctr does not list it)"
  fi
fi
if [ ${#MISSING[@]} -gt 0 ]; then
  for m in "${MISSING[@]}"; do say "missing: $m"; done
  say ""
  say "== summary =="
  say "FAIL prerequisites: ${#MISSING[@]} missing (above); nothing was started"
  exit 3
fi
say "node $NODE: nvidia.com/gpu allocatable, product $PRODUCT; image $IMAGE"
if [ "$CHECK_ONLY" -eq 1 ]; then
  say ""
  say "== summary =="
  say "PASS prerequisites (--check-only: no job was run)"
  exit 0
fi

# ---- the check ---------------------------------------------------------------------------------

WORK=$(mktemp -d "${TMPDIR:-/tmp}/sxwl-gpu-check-k8s.XXXXXX")
AGENT_NS=sxwl-gpu-check-$(printf '%04x%04x' "$RANDOM" "$RANDOM")
NAMESPACES=()
PIDS=()

cleanup() {
  local status=$? i pid
  trap - EXIT
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do  # the agent before the cloud
    pid=${PIDS[i]}
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [ "$KEEP" -eq 0 ]; then
    for ns in "${NAMESPACES[@]}"; do kube delete namespace "$ns" --wait=false >/dev/null 2>&1 || warn "could not delete namespace $ns"; done
  elif [ ${#NAMESPACES[@]} -gt 0 ]; then
    warn "namespaces kept: ${NAMESPACES[*]}"
  fi
  say ""
  say "== summary =="
  for r in "${RESULTS[@]}"; do say "$r"; done
  if [ "$status" -eq 0 ] && [ ${#RESULTS[@]} -gt 0 ] && ! printf '%s\n' "${RESULTS[@]}" | grep -q '^FAIL'; then
    say "PASS: a GPU job on Kubernetes used CUDA and its checkpoint came back"
    if [ "$KEEP" -eq 1 ]; then warn "logs kept in $WORK"; else rm -rf "$WORK"; fi
    exit 0
  fi
  say "FAIL (logs in $WORK)"
  exit 1
}
trap cleanup EXIT
trap 'fail "interrupted"; exit 1' INT TERM HUP

left() { echo $((DEADLINE - SECONDS)); }
give_up() { fail "$*"; exit 1; }
# Polls a Python check (stdin: its code) until it exits 0, within the overall deadline.
poll() {
  local what=$1 code
  code=$(cat)
  while ! "$PY" -c "$code" 2>>"$WORK/poll.err"; do
    [ "$(left)" -gt 0 ] || give_up "timed out ($TIMEOUT_S s in all) waiting for $what"
    for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null || give_up "a process exited while waiting for $what (see $WORK)"; done
    sleep 1
  done
}

unset SXWL_DATABASE_URL SXWL_DATA_DIR SXWL_PUBLIC_URL SXWL_ACCESS_KEY SXWL_API_URL SXWL_CONFIG_DIR
export SXWL_BILLING_ENABLED=false SXWL_HEARTBEAT_INTERVAL_MIN_S=0.5 SXWL_LOG_LEVEL=WARNING
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
PASSWORD=$("$PY" -c 'import secrets; print(secrets.token_urlsafe(18))')
for account in provider:gpu-check-provider@example.com user:gpu-check-user@example.com; do
  printf '%s\n' "$PASSWORD" | "$VENV/bin/sxwl" admin create-user --email "${account#*:}" --role "${account%%:*}" \
    --name "GPU check" --password-stdin --data-dir "$WORK/data" >>"$WORK/create-user.log" 2>&1 ||
    give_up "sxwl admin create-user failed (see $WORK/create-user.log)"
done
"$VENV/bin/sxwl" serve --port "$PORT" --data-dir "$WORK/data" >"$WORK/cloud.log" 2>&1 &
PIDS+=($!)
export SXWL_CHECK_URL=$URL SXWL_CHECK_PASSWORD=$PASSWORD
poll "the cloud to answer /healthz" <<'EOF'
import os, httpx
assert httpx.get(os.environ["SXWL_CHECK_URL"] + "/healthz", timeout=2).status_code == 200
EOF

# Tokens and keys through the environment and pipes, never argv.
token_of() {
  "$PY" -c 'import os, sys, httpx
r = httpx.post(os.environ["SXWL_CHECK_URL"] + "/api/v1/auth/login", timeout=30,
               json={"email": sys.argv[1], "password": os.environ["SXWL_CHECK_PASSWORD"]})
r.raise_for_status()
print(r.json()["access_token"])' "$1"
}
PROVIDER_TOKEN=$(token_of gpu-check-provider@example.com) || give_up "signing in as the provider failed"
SXWL_CHECK_TOKEN=$(token_of gpu-check-user@example.com) || give_up "signing in as the user failed"
export SXWL_CHECK_TOKEN
KEY=$(SXWL_CHECK_TOKEN=$PROVIDER_TOKEN "$PY" -c 'import os, httpx
r = httpx.get(os.environ["SXWL_CHECK_URL"] + "/api/v1/me/access-key", timeout=30,
              headers={"Authorization": "Bearer " + os.environ["SXWL_CHECK_TOKEN"]})
r.raise_for_status()
print(r.json()["access_key"])') || give_up "fetching the accessKey failed"

kube create namespace "$AGENT_NS" >/dev/null || give_up "kubectl create namespace $AGENT_NS failed"
NAMESPACES+=("$AGENT_NS")
SXWL_ACCESS_KEY=$KEY "$VENV/bin/sxwl-agent" --api-url "$URL" --runtime kubernetes \
  --kubeconfig "$KUBECONFIG_FILE" --namespace "$AGENT_NS" --state-dir "$WORK/agent" \
  --name gpu-check-k8s --heartbeat-interval 1 >"$WORK/agent.log" 2>&1 &
PIDS+=($!)
unset KEY
say "cloud $URL, agent in namespace $AGENT_NS; waiting for the CPod and its GPU"
SXWL_CHECK_TOKEN=$PROVIDER_TOKEN poll "the CPod online with an allocatable GPU" <<'EOF'
import os, httpx
cpods = httpx.get(os.environ["SXWL_CHECK_URL"] + "/api/v1/cpods", timeout=30,
                  headers={"Authorization": "Bearer " + os.environ["SXWL_CHECK_TOKEN"]}).json()
assert any(c["status"] == "online" and any((n.get("gpu") or {}).get("allocatable", 0) > 0 for n in c["nodes"])
           for c in cpods)
EOF
pass "the CPod is online and shows the node's GPU"

# tiny-lm's script and text travel in the command (about 50,000 of its 100,000 characters), so any
# image with python3 and PyTorch runs it.
export SXWL_CHECK_IMAGE=$IMAGE SXWL_CHECK_PRODUCT=$PRODUCT SXWL_CHECK_EXAMPLE=$EXAMPLE SXWL_CHECK_MAX_S=$TIMEOUT_S
JOB_ID=$("$PY" <<'EOF'
import os, pathlib, httpx
example = pathlib.Path(os.environ["SXWL_CHECK_EXAMPLE"])
parts = ['set -e; d="${TMPDIR:-/tmp}/tiny-lm"; mkdir -p "$d"']
for name, end in (("train.py", "SXWL_END_OF_TRAIN_PY"), ("input.txt", "SXWL_END_OF_INPUT_TXT")):
    text = (example / name).read_text()
    parts.append(f"cat > \"$d/{name}\" <<'{end}'\n{text.rstrip(chr(10))}\n{end}")
parts.append('exec "${TINY_LM_PYTHON:-python3}" "$d/train.py"')
body = {
    "name": "tiny-lm (gpu-check k8s)",
    "image": os.environ["SXWL_CHECK_IMAGE"],
    "command": "\n".join(parts),
    "env": {"TINY_LM_STEPS": "200", "TINY_LM_BACKEND": "auto"},
    "gpu_product": os.environ["SXWL_CHECK_PRODUCT"],
    "gpus_per_node": 1,
    "max_runtime_s": int(os.environ["SXWL_CHECK_MAX_S"]),
}
r = httpx.post(os.environ["SXWL_CHECK_URL"] + "/api/v1/jobs", json=body, timeout=30,
               headers={"Authorization": "Bearer " + os.environ["SXWL_CHECK_TOKEN"]})
if r.status_code != 201:
    raise SystemExit(f"submitting the job was refused: {r.status_code} {r.text}")
print(r.json()["id"])
EOF
) || give_up "submitting tiny-lm failed"
export SXWL_CHECK_JOB=$JOB_ID
say "submitted tiny-lm as job $JOB_ID (1 x nvidia.com/gpu, image $IMAGE)"

job_state() {
  "$PY" -c 'import os, httpx
job = httpx.get(os.environ["SXWL_CHECK_URL"] + "/api/v1/jobs/" + os.environ["SXWL_CHECK_JOB"], timeout=30,
                headers={"Authorization": "Bearer " + os.environ["SXWL_CHECK_TOKEN"]}).json()
print(job["state"], job.get("reason") or "")'
}

# The pod as Kubernetes has it: its namespace (to delete afterwards) and what it asked for.
until pods=$(kube get pods -A -l "sxwl.ai/job-id=$JOB_ID" -o json 2>/dev/null) &&
  pod=$(printf '%s' "$pods" | "$PY" -c 'import json, sys
items = json.load(sys.stdin)["items"]
assert items
main = next(c for c in items[0]["spec"]["containers"] if c["name"] == "main")
print(items[0]["metadata"]["namespace"], main.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", "none"))' 2>/dev/null); do
  state=$(job_state 2>/dev/null || echo "unknown")
  case $state in succeeded* | failed* | cancelled*) give_up "the job ended without a pod: $state" ;; esac
  [ "$(left)" -gt 0 ] || give_up "timed out waiting for the job's pod (job: $state; see $WORK/agent.log)"
  sleep 1
done
NAMESPACES+=("${pod%% *}")
limit=${pod#* }
if [ "$limit" = "1" ]; then pass "the pod in ${pod%% *} asks for nvidia.com/gpu: 1"; else fail "the pod's nvidia.com/gpu limit is $limit, not 1"; fi

until state=$(job_state 2>/dev/null) && case $state in succeeded* | failed* | cancelled*) true ;; *) false ;; esac; do
  [ "$(left)" -gt 0 ] || give_up "timed out ($TIMEOUT_S s in all) waiting for the job to end (it is ${state:-unknown})"
  sleep 1
done
"$PY" - "$WORK" <<'EOF' >"$WORK/checks.txt" || give_up "reading the job's results failed"
import hashlib, os, re, sys, httpx
work = sys.argv[1]
url, job_id = os.environ["SXWL_CHECK_URL"], os.environ["SXWL_CHECK_JOB"]
headers = {"Authorization": "Bearer " + os.environ["SXWL_CHECK_TOKEN"]}
job = httpx.get(f"{url}/api/v1/jobs/{job_id}", headers=headers, timeout=30).json()
log = httpx.get(f"{url}/api/v1/jobs/{job_id}/logs", headers=headers, timeout=30).text
open(os.path.join(work, "job.log"), "w").write(log)
if job["state"] == "succeeded":
    print("PASS the job succeeded (exit code 0)")
else:
    tail = " | ".join(log.strip().splitlines()[-3:])
    print(f"FAIL the job ended {job['state']}: {job.get('reason')} (log: {tail or 'empty'})")
cuda = re.search(r"^.*tiny-lm torch GPT on cuda.*$", log, re.MULTILINE)
if cuda:
    print(f"PASS CUDA in use: {cuda.group(0).strip()[:160]}")
else:
    said = re.search(r"^.*(tiny-lm (torch|numpy)|CUDA_VISIBLE_DEVICES).*$", log, re.MULTILINE)
    print("FAIL the log does not show CUDA in use"
          + (f" ({said.group(0).strip()[:160]})" if said else " (the log is empty)" if not log.strip() else "")
          + ": the image's torch needs CUDA, and containerd the NVIDIA runtime")
listed = httpx.get(f"{url}/api/v1/jobs/{job_id}/artifacts", headers=headers, timeout=30).json()
checkpoints = [a for a in listed if a["path"].rsplit("/", 1)[-1].startswith("checkpoint.")]
if not checkpoints:
    print(f"FAIL no checkpoint artifact (artifacts: {[a['path'] for a in listed] or 'none'})")
for a in checkpoints:
    digest, size = hashlib.sha256(), 0
    with httpx.stream("GET", f"{url}/api/v1/jobs/{job_id}/artifacts/{a['path']}", headers=headers, timeout=120) as r:
        for chunk in r.iter_bytes():
            digest.update(chunk)
            size += len(chunk)
    ok = r.status_code == 200 and size == a["size"] and digest.hexdigest() == a["sha256"]
    print(f"{'PASS' if ok else 'FAIL'} checkpoint artifact {a['path']}: {size} bytes, sha256 "
          f"{'as listed' if ok else 'differs from the listing'}")
EOF
while IFS= read -r line; do
  case $line in PASS\ *) pass "${line#PASS }" ;; *) fail "${line#FAIL }" ;; esac
done <"$WORK/checks.txt"
