"""How preflight judges the facts a host reports (the ✗ paths loopback hosts cannot show)."""

from __future__ import annotations

from pathlib import Path

from sxwl.ctl import config as cfg
from sxwl.ctl.preflight import GIB, judge, judge_nvidia, judge_ports, judge_runtime, parse_facts

FACTS = """\
os_id=ubuntu
os_version=22.04
os_name=Ubuntu 22.04.4 LTS
kernel=5.15.0-105-generic
arch=x86_64
hostname=worker1
machine_id=0123456789abcdef0123456789abcdef
uid=1000
sudo=fail
cpus=96
mem_kib=1056000000
swap=/swap.img 8388604
listen=0016
listen=280A
disk=/ 500000000 /
disk=/var/lib 40000 /var/lib
disk=/opt 500000000 /
module=overlay loaded
module=br_netfilter available
nvidia_rc=0
nvidia=NVIDIA H100 80GB HBM3, 81559, 550.54.15
nvidia=NVIDIA H100 80GB HBM3, 81559, 550.54.15
runtime=docker active
time=0
"""


def config(tmp_path: Path) -> cfg.ClusterConfig:
    path = tmp_path / "c.conf"
    path.write_text(
        "hosts:\n"
        "  - {name: master1, internalAddress: 10.0.0.1, password: x}\n"
        "  - {name: worker1, internalAddress: 10.0.0.2, user: ubuntu, password: x, arch: arm64}\n"
        "roleGroups: {etcd: [master1], control-plane: [master1], worker: [worker1], registry: [master1]}\n"
    )
    return cfg.load(path)


def test_parse_and_judge_a_problem_host(tmp_path: Path) -> None:
    conf = config(tmp_path)
    facts = parse_facts(FACTS)
    assert facts["listen"] == {22, 10250}
    checks = judge(conf, conf.host("worker1"), facts, skew=7.5)
    assert checks["sudo"].status == "fail"
    assert "ubuntu ALL=(ALL) NOPASSWD: ALL" in checks["sudo"].fix
    assert (
        checks["arch"].status == "fail"
        and checks["arch"].fix == "set `arch: amd64` for worker1 in the config"
    )
    assert checks["swap"].status == "fail" and "swapoff -a" in checks["swap"].fix
    assert checks["ports"].status == "fail" and checks["ports"].detail == "in use: 10250"
    assert checks["disk"].status == "fail" and checks["disk"].detail == "/var/lib: 0.0 GiB free"
    assert checks["clock"].status == "fail" and checks["clock"].detail == "+7.5s off this machine"
    assert checks["modules"].status == "warn"  # loadable: KubeKey loads it
    assert (
        checks["nvidia"].status == "ok"
        and checks["nvidia"].detail == "2× NVIDIA H100 80GB HBM3, driver 550.54.15"
    )
    assert checks["runtime"].status == "warn" and "Docker is running" in checks["runtime"].detail
    assert checks["os"].status == "ok" and checks["cpu"].status == "ok"


def test_nvidia_states() -> None:
    assert judge_nvidia({"nvidia_rc": "absent", "nvidia": []}, worker=True).status == "warn"
    assert judge_nvidia({"nvidia_rc": "absent", "nvidia": []}, worker=False).status == "skip"
    broken = judge_nvidia(
        {
            "nvidia_rc": "9",
            "nvidia": ["NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."],
        },
        worker=True,
    )
    assert broken.status == "fail" and broken.detail.startswith("nvidia-smi fails: NVIDIA-SMI has failed")
    assert "repair the NVIDIA driver" in broken.fix


def test_ports_by_role_and_runtime() -> None:
    listening = {6443, 2379}
    assert judge_ports(listening, ["worker"]).status == "ok"
    control = judge_ports(listening, ["etcd", "control-plane"])
    assert control.status == "fail" and control.detail == "in use: 2379, 6443"
    assert judge_runtime({}).detail == "none (KubeKey installs containerd)"
    assert judge_runtime({"containerd": "inactive"}).status == "ok"


def test_small_control_plane(tmp_path: Path) -> None:
    conf = config(tmp_path)
    facts = parse_facts(FACTS.replace("cpus=96", "cpus=1").replace("mem_kib=1056000000", f"mem_kib={GIB}"))
    checks = judge(conf, conf.host("master1"), facts, skew=0.0)
    assert checks["cpu"].status == "fail" and "at least 2 CPUs" in checks["cpu"].fix
    assert checks["memory"].status == "fail"
    assert checks["nvidia"].status == "skip"
