#!/usr/bin/env bash
# gpu-check.sh: does 算想云 see this machine's NVIDIA GPUs as nvidia-smi does? For a GPU machine
# WITHOUT network access: everything it installs is carried over in a directory.
#
# Usage:
#   scripts/gpu-check.sh prepare DIR [--python-version 3.11] [--train]
#       On a machine with network access, in a checkout of this project: builds the sxwl wheel and
#       downloads the wheels of all its runtime dependencies for Linux x86_64, CPython 3.11, into
#       DIR/wheels, and copies this script to DIR/gpu-check.sh. Carry DIR to the GPU machine.
#       --train: the `train` extra's wheels too (torch with CUDA: a few GB), for `trainer`.
#
#   DIR/gpu-check.sh run DIR [--require-gpu] [--python PYTHON] [--keep]
#       On the GPU machine (no network needed): creates DIR/venv with PYTHON (python3.11, else
#       python3), installs sxwl offline from DIR/wheels (pip --no-index --find-links), then checks.
#
#   scripts/gpu-check.sh run --use-venv PATH [--require-gpu] [--keep]
#       The same check with an existing virtualenv where sxwl is installed (e.g. the checkout's .venv).
#
#   DIR/gpu-check.sh trainer DIR [--python PYTHON] [gpucheck options]
#   scripts/gpu-check.sh trainer --use-venv PATH [gpucheck options]
#       The fine-tune trainer on this machine's GPU: sets up the venv as `run` does (DIR prepared
#       with `prepare DIR --train`, which adds the `train` extra: torch, transformers, peft...), then
#       runs `python -m sxwl.trainer.gpucheck`: a Llama of about 30M parameters built offline, LoRA
#       fine-tuned by `python -m sxwl.trainer` with CUDA; prints torch.cuda.get_device_name(), steps/s
#       and tokens/s. Exit status 1 without CUDA or when the run fails. Its options: --examples N,
#       --batch-size N, --epochs N, --keep WORKDIR.
#
#   DIR/gpu-check.sh k8s DIR --image IMAGE [--python PYTHON] [gpu-check-k8s.sh options]
#   scripts/gpu-check.sh k8s --use-venv PATH --image IMAGE [gpu-check-k8s.sh options]
#       The Kubernetes variant, for a GPU machine with a (single-node) cluster and the NVIDIA device
#       plugin: sets up the venv as `run` does, then runs gpu-check-k8s.sh (beside this script; its
#       own header says what it checks): tiny-lm through `sxwl-agent --runtime kubernetes` with
#       nvidia.com/gpu: 1, CUDA in its log, its checkpoint downloaded; a PASS/FAIL summary. Missing
#       prerequisites (kubectl, the cluster, the device plugin, a GPU) are listed, exit status 3.
#
# The check: starts `sxwl serve` on a free loopback port with a throwaway data dir (SQLite), creates
# a provider with `sxwl admin create-user --role provider --password-stdin`, signs in to fetch its
# accessKey, starts `sxwl-agent` with the key in SXWL_ACCESS_KEY (never on a command line) and a 1 s
# heartbeat, waits until GET /api/v1/cpods shows the CPod online, then prints what the cloud shows
# for the node (product, GPU memory, count, allocatable, driver, CUDA, per-device utilization and
# temperature) next to `nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv`.
# Everything it started is stopped (by pid) when it exits, however it exits.
#
# Exit status: 0 when the cloud's GPU count equals nvidia-smi's, or when the machine has no NVIDIA GPU
# (said plainly) and --require-gpu was not given; 1 when the counts differ, there is no GPU under
# --require-gpu, or a step fails; 2 on wrong usage.
set -euo pipefail

PROG=$(basename "$0")
SCRIPT_PATH=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
WAIT_ONLINE_S=${GPU_CHECK_WAIT_S:-90}

# Fd 3 is the script's own stderr: warnings from a trap must not go where the interrupted
# command's stderr went (say, /dev/null).
exec 3>&2
say() { printf '%s\n' "$*"; }
warn() { printf '%s: %s\n' "$PROG" "$*" >&3; }
die() {
  warn "error: $*"
  exit 1
}
usage() {
  sed -n '2,/^set -euo/p' "$SCRIPT_PATH" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# ---- prepare ---------------------------------------------------------------------------------------

prepare() {
  local dir="" pyver="3.11" train=0
  while [ $# -gt 0 ]; do
    case $1 in
      --python-version) [ $# -ge 2 ] || usage; pyver=$2; shift 2 ;;
      --train) train=1; shift ;;
      -h | --help) usage ;;
      -*) warn "unknown option $1"; usage ;;
      *) [ -z "$dir" ] || usage; dir=$1; shift ;;
    esac
  done
  [ -n "$dir" ] || usage
  local root
  root=$(cd "$(dirname "$SCRIPT_PATH")/.." && pwd)
  [ -f "$root/pyproject.toml" ] || die "prepare runs from a checkout of sxwl ($root has no pyproject.toml)"
  local python=${PYTHON:-python3}
  command -v "$python" >/dev/null || die "$python not found (set PYTHON=...)"
  local abi="cp${pyver/./}"

  mkdir -p "$dir/wheels"
  dir=$(cd "$dir" && pwd)
  local tmp
  tmp=$(mktemp -d)
  # shellcheck disable=SC2064 # expand now: tmp is local
  trap "rm -rf '$tmp'" EXIT
  say "building the sxwl wheel from $root"
  "$python" -m venv "$tmp/build-venv"
  "$tmp/build-venv/bin/pip" install --quiet --upgrade pip
  "$tmp/build-venv/bin/pip" wheel --quiet --no-deps -w "$dir/wheels" "$root"
  local wheel
  wheel=$(find "$dir/wheels" -maxdepth 1 -name 'sxwl-*.whl' -newer "$tmp/build-venv" | head -n 1)
  [ -n "$wheel" ] || wheel=$(find "$dir/wheels" -maxdepth 1 -name 'sxwl-*.whl' | sort | tail -n 1)
  [ -n "$wheel" ] || die "no sxwl wheel was built"
  say "downloading its runtime dependencies for linux x86_64 / CPython $pyver ($abi)"
  "$tmp/build-venv/bin/pip" download --quiet --dest "$dir/wheels" --only-binary=:all: \
    --implementation cp --python-version "$pyver" --abi "$abi" --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform linux_x86_64 --platform any \
    "$wheel"
  if [ "$train" -eq 1 ]; then
    say "downloading the train extra's wheels (torch, transformers, peft, ...)"
    "$tmp/build-venv/bin/pip" download --quiet --dest "$dir/wheels" --only-binary=:all: \
      --implementation cp --python-version "$pyver" --abi "$abi" --abi abi3 --abi none \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform linux_x86_64 --platform any \
      "sxwl[train] @ file://$wheel"
  fi
  cp "$SCRIPT_PATH" "$dir/gpu-check.sh"
  cp "$(dirname "$SCRIPT_PATH")/gpu-check-k8s.sh" "$dir/gpu-check-k8s.sh"
  chmod +x "$dir/gpu-check.sh" "$dir/gpu-check-k8s.sh"
  mkdir -p "$dir/tiny-lm"
  cp "$root/examples/tiny-lm/train.py" "$root/examples/tiny-lm/input.txt" "$dir/tiny-lm/"
  say "ready: $(find "$dir/wheels" -name '*.whl' | wc -l) wheels in $dir/wheels"
  say "on the GPU machine: $dir/gpu-check.sh run $dir"
}

# ---- run ---------------------------------------------------------------------------------------------

WORK=""
KEEP=0
PIDS=()

cleanup() {
  local status=$?
  local i pid
  # Stop in reverse order of start (the agent before the cloud), each by its own pid.
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    pid=${PIDS[i]}
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
      if kill -0 "$pid" 2>/dev/null; then
        warn "pid $pid did not stop in 10 s; killing it"
        kill -KILL "$pid" 2>/dev/null || true
      fi
      wait "$pid" 2>/dev/null || true
    fi
  done
  if [ -n "$WORK" ] && [ -d "$WORK" ]; then
    if [ "$KEEP" -eq 1 ] || [ "$status" -ne 0 ]; then
      warn "logs kept in $WORK (cloud.log, agent.log)"
    else
      rm -rf "$WORK"
    fi
  fi
  exit "$status"
}

on_signal() {
  warn "interrupted"
  exit 130
}

# Runs Python from the check's venv: HTTP and JSON without curl or jq.
py() { "$VENV/bin/python" "$@"; }

free_port() {
  py -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}

wait_healthy() {
  local url=$1 pid=$2
  for _ in $(seq 1 300); do
    kill -0 "$pid" 2>/dev/null || {
      tail -n 30 "$WORK/cloud.log" >&2
      die "the cloud exited during start (log above)"
    }
    if py -c 'import sys, httpx
sys.exit(0 if httpx.get(sys.argv[1] + "/healthz", timeout=1).status_code == 200 else 1)' "$url" 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  die "the cloud did not answer /healthz in 30 s (see $WORK/cloud.log)"
}

# Sets VENV: --use-venv's, or DIR/venv installed offline from DIR/wheels (again when DIR was
# prepared again since).
setup_venv() {
  local dir=$1 use_venv=$2 python=$3
  if [ -n "$use_venv" ]; then
    VENV=$(cd "$use_venv" && pwd)
  else
    [ -d "$dir/wheels" ] || die "$dir/wheels not found: run '$PROG prepare $dir' on a networked machine first"
    dir=$(cd "$dir" && pwd)
    if [ -z "$python" ]; then
      python=$(command -v python3.11 || command -v python3 || true)
      [ -n "$python" ] || die "no python3.11 or python3 on PATH (give --python)"
    fi
    local version
    version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [ "$version" = "3.11" ] || warn "warning: $python is Python $version; the wheels are for 3.11"
    VENV=$dir/venv
    local marker=$VENV/.gpu-check-installed
    # (Re)install when there is no venv yet, or when DIR/wheels was prepared again since.
    if [ ! -f "$marker" ] || [ -n "$(find "$dir/wheels" -name '*.whl' -newer "$marker" | head -n 1)" ]; then
      say "creating $VENV and installing sxwl from $dir/wheels (offline)"
      rm -rf "$VENV"
      "$python" -m venv "$VENV" ||
        die "$python -m venv failed (on Debian or Ubuntu, install the python3.11-venv package)"
      local what=sxwl
      # The train extra when `prepare --train` brought its wheels.
      if [ -n "$(find "$dir/wheels" -maxdepth 1 -name 'torch-*.whl' | head -n 1)" ]; then
        what="sxwl[train]"
      fi
      "$VENV/bin/pip" install --quiet --no-index --find-links "$dir/wheels" "$what" ||
        die "installing from $dir/wheels failed: prepare it for this Python ($version) and platform"
      touch "$marker"
    fi
  fi
  if [ ! -x "$VENV/bin/sxwl" ] || [ ! -x "$VENV/bin/sxwl-agent" ]; then
    die "$VENV has no sxwl and sxwl-agent installed"
  fi
}

run() {
  local dir="" use_venv="" require_gpu=0 python=""
  while [ $# -gt 0 ]; do
    case $1 in
      --use-venv) [ $# -ge 2 ] || usage; use_venv=$2; shift 2 ;;
      --require-gpu) require_gpu=1; shift ;;
      --python) [ $# -ge 2 ] || usage; python=$2; shift 2 ;;
      --keep) KEEP=1; shift ;;
      -h | --help) usage ;;
      -*) warn "unknown option $1"; usage ;;
      *) [ -z "$dir" ] || usage; dir=$1; shift ;;
    esac
  done
  [ -n "$dir" ] || [ -n "$use_venv" ] || usage

  trap cleanup EXIT
  trap on_signal INT TERM HUP
  setup_venv "$dir" "$use_venv" "$python"

  # A throwaway cloud, whatever this shell's SXWL_* variables say.
  unset SXWL_DATABASE_URL SXWL_DATA_DIR SXWL_PUBLIC_URL SXWL_ACCESS_KEY SXWL_API_URL SXWL_CONFIG_DIR
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/sxwl-gpu-check.XXXXXX")
  local data=$WORK/data port url
  port=$(free_port)
  url=http://127.0.0.1:$port

  local email=gpu-check@example.com password
  password=$(py -c 'import secrets; print(secrets.token_urlsafe(18))')
  say "creating provider $email"
  printf '%s\n' "$password" |
    "$VENV/bin/sxwl" admin create-user --email "$email" --role provider --name "GPU check" \
      --password-stdin --data-dir "$data" >"$WORK/create-user.log" 2>&1 ||
    {
      cat "$WORK/create-user.log" >&2
      die "sxwl admin create-user failed"
    }

  say "starting the cloud on $url (data in $data)"
  SXWL_LOG_LEVEL=WARNING SXWL_HEARTBEAT_INTERVAL_MIN_S=0.5 \
    "$VENV/bin/sxwl" serve --port "$port" --data-dir "$data" >"$WORK/cloud.log" 2>&1 &
  PIDS+=($!)
  wait_healthy "$url" "${PIDS[0]}"

  # The password and the keys travel through the environment and pipes, never argv.
  local token key
  token=$(SXWL_CHECK_PASSWORD=$password py -c 'import os, sys, httpx
r = httpx.post(sys.argv[1] + "/api/v1/auth/login", timeout=30,
               json={"email": sys.argv[2], "password": os.environ["SXWL_CHECK_PASSWORD"]})
r.raise_for_status()
print(r.json()["access_token"])' "$url" "$email") || die "signing in as $email failed"
  key=$(SXWL_CHECK_TOKEN=$token py -c 'import os, sys, httpx
r = httpx.get(sys.argv[1] + "/api/v1/me/access-key", timeout=30,
              headers={"Authorization": "Bearer " + os.environ["SXWL_CHECK_TOKEN"]})
r.raise_for_status()
print(r.json()["access_key"])' "$url") || die "fetching the accessKey failed"

  say "starting sxwl-agent (heartbeat every 1 s)"
  SXWL_ACCESS_KEY=$key "$VENV/bin/sxwl-agent" --api-url "$url" --state-dir "$WORK/agent" \
    --name gpu-check --heartbeat-interval 1 >"$WORK/agent.log" 2>&1 &
  PIDS+=($!)
  unset key

  say "waiting for the CPod to come online (up to ${WAIT_ONLINE_S} s)"
  local deadline=$((SECONDS + WAIT_ONLINE_S))
  while :; do
    kill -0 "${PIDS[1]}" 2>/dev/null || {
      tail -n 30 "$WORK/agent.log" >&2
      die "sxwl-agent exited (log above)"
    }
    if SXWL_CHECK_TOKEN=$token py -c 'import json, os, sys, httpx
r = httpx.get(sys.argv[1] + "/api/v1/cpods", timeout=30,
              headers={"Authorization": "Bearer " + os.environ["SXWL_CHECK_TOKEN"]})
r.raise_for_status()
online = [c for c in r.json() if c["status"] == "online" and c["nodes"]]
if not online:
    sys.exit(1)
with open(sys.argv[2], "w") as f:
    json.dump(online[0], f)' "$url" "$WORK/cpod.json" 2>/dev/null; then
      break
    fi
    [ "$SECONDS" -lt "$deadline" ] || die "the CPod was not online after ${WAIT_ONLINE_S} s (see $WORK/agent.log)"
    sleep 0.5
  done

  # nvidia-smi's view, saved for the report (empty when there is no nvidia-smi or no driver).
  local smi=$WORK/nvidia-smi.csv smi_devices=$WORK/nvidia-smi-devices.csv smi_note=""
  : >"$smi"
  : >"$smi_devices"
  if ! command -v nvidia-smi >/dev/null; then
    smi_note="nvidia-smi not found"
  elif ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$smi" 2>"$WORK/nvidia-smi.err"; then
    smi_note="nvidia-smi failed: $(head -n 1 "$WORK/nvidia-smi.err")"
    : >"$smi"
  else
    nvidia-smi --query-gpu=index,uuid,utilization.gpu,memory.used,temperature.gpu --format=csv \
      >"$smi_devices" 2>/dev/null || : >"$smi_devices"
  fi

  py - "$WORK/cpod.json" "$smi" "$smi_devices" "$smi_note" "$require_gpu" <<'EOF'
import csv
import json
import sys

cpod_path, smi_path, devices_path, smi_note, require_gpu = sys.argv[1:6]
cpod = json.load(open(cpod_path))

print()
print("== what 算想云 shows for this machine (GET /api/v1/cpods) ==")
print(f"CPod {cpod['name']} ({cpod['id']}): {cpod['status']}, agent {cpod['agent_version']}")
cloud_total = 0
products, drivers = set(), set()
for node in cpod["nodes"]:
    print(f"node {node['name']}: {node['status']}, {node['cpu_cores']} CPU cores, {node['memory_mib']} MiB memory")
    gpu = node.get("gpu")
    if gpu is None:
        print("  gpu: null")
        continue
    cloud_total += gpu["count"]
    products.add(gpu["product"])
    drivers.add(gpu.get("driver"))
    print(f"  gpu: {gpu['vendor']} {gpu['product']}")
    print(f"       memory {gpu['memory_mib']} MiB each, count {gpu['count']}, allocatable {gpu['allocatable']}, "
          f"used {gpu.get('used', 0)}")
    print(f"       driver {gpu.get('driver')}, CUDA {gpu.get('cuda')}")
    for d in gpu.get("devices", []):
        print(f"       #{d['index']} {d.get('uuid')}: utilization {d.get('utilization_pct')} %, "
              f"memory used {d.get('memory_used_mib')} MiB, temperature {d.get('temperature_c')} °C")

print()
print("== nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv ==")
rows = []
with open(smi_path) as f:
    text = f.read()
if text.strip():
    print(text.rstrip())
    rows = list(csv.DictReader(text.splitlines(), skipinitialspace=True))
    with open(devices_path) as f:
        devices = f.read().rstrip()
    if devices:
        print()
        print("== nvidia-smi --query-gpu=index,uuid,utilization.gpu,memory.used,temperature.gpu ==")
        print(devices)
else:
    print(smi_note or "no output")

print()
smi_total = len(rows)
if smi_total == 0:
    if cloud_total:
        print(f"MISMATCH: the cloud shows {cloud_total} GPU(s) but nvidia-smi shows none ({smi_note or 'empty'})")
        sys.exit(1)
    print(f"no NVIDIA GPU on this machine ({smi_note or 'nvidia-smi lists none'}); "
          "the cloud shows the node with gpu: null, as it should")
    if require_gpu == "1":
        print("FAIL: --require-gpu was given")
        sys.exit(1)
    sys.exit(0)

names = {"-".join(r.get("name", "").split()) for r in rows}
smi_drivers = {r.get("driver_version", "").strip() for r in rows}
if products and names != products:
    print(f"note: product names differ: cloud {sorted(products)}, nvidia-smi {sorted(names)} "
          "(a machine with mixed GPUs reports its most numerous kind)")
def mib(text):
    number = text.strip().split()[0] if text and text.strip() else ""
    return int(number) if number.isdigit() else None


smi_memory = {mib(r.get("memory.total [MiB]", "")) for r in rows}
cloud_memory = {g["memory_mib"] for n in cpod["nodes"] if (g := n.get("gpu"))}
if cloud_memory and smi_memory != cloud_memory:
    print(f"note: GPU memory differs: cloud {sorted(cloud_memory)} MiB, nvidia-smi {sorted(smi_memory, key=str)} MiB")
if drivers and smi_drivers != drivers:
    print(f"note: driver versions differ: cloud {sorted(map(str, drivers))}, nvidia-smi {sorted(smi_drivers)}")
if cloud_total != smi_total:
    print(f"MISMATCH: the cloud shows {cloud_total} GPU(s), nvidia-smi shows {smi_total}")
    sys.exit(1)
print(f"OK: the cloud shows {cloud_total} GPU(s), as nvidia-smi does")
EOF
}

# ---- k8s ---------------------------------------------------------------------------------------------

# [DIR] [--use-venv V] [--python P] [OPTIONS...]: sets up $VENV and leaves the rest in REST, for
# the checker that runs next to judge.
venv_then_rest() {
  local dir="" use_venv="" python=""
  REST=()
  if [ $# -gt 0 ] && [[ $1 != -* ]]; then
    dir=$1
    shift
  fi
  while [ $# -gt 0 ]; do
    case $1 in
      --use-venv) [ $# -ge 2 ] || usage; use_venv=$2; shift 2 ;;
      --python) [ $# -ge 2 ] || usage; python=$2; shift 2 ;;
      -h | --help) usage ;;
      *) REST+=("$1"); shift ;;
    esac
  done
  [ -n "$dir" ] || [ -n "$use_venv" ] || usage
  setup_venv "$dir" "$use_venv" "$python"
}

k8s() {
  venv_then_rest "$@"
  exec "$(dirname "$SCRIPT_PATH")/gpu-check-k8s.sh" --venv "$VENV" "${REST[@]}"
}

# ---- trainer -----------------------------------------------------------------------------------------

trainer() {
  venv_then_rest "$@"
  "$VENV/bin/python" -c 'import torch, transformers, peft' 2>/dev/null ||
    die "$VENV lacks the train extra (torch, transformers, peft): prepare DIR with --train, or pip install 'sxwl[train]'"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  fi
  exec "$VENV/bin/python" -m sxwl.trainer.gpucheck "${REST[@]}"
}

# ---- main ------------------------------------------------------------------------------------------

[ $# -ge 1 ] || usage
command=$1
shift
case $command in
  prepare) prepare "$@" ;;
  run) run "$@" ;;
  k8s) k8s "$@" ;;
  trainer) trainer "$@" ;;
  -h | --help | help) usage ;;
  *) warn "unknown command $command"; usage ;;
esac
