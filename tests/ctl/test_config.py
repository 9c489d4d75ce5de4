"""The config file: the guide's format, ranges, and every error with file:line:column and a fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from sxwl.ctl import config as cfg
from sxwl.ctl.sample import SAMPLE_CONFIG
from tests.ctl.conftest import run_ctl

SEED = Path(__file__).resolve().parents[3] / "shared" / "seed" / "000_6d6f4f843d525029.txt"

# The guide's example exactly as printed: `roleGroups:` indented by two spaces under `hosts:`.
GUIDE_PASTE = """\
hosts:
  - {name: master1, internalAddress: 192.168.1.1, port: 22, user: root, privateKeyPath: "KEY"}
  - {name: master2, internalAddress: 192.168.1.2, port: 22, user: root, privateKeyPath: "KEY"}
  - {name: master3, internalAddress: 192.168.1.3, port: 22, user: root, privateKeyPath: "KEY"}
  - {name: worker1, internalAddress: 192.168.1.4, port: 22, user: root, privateKeyPath: "KEY"}
  - {name: worker2, internalAddress: 192.168.1.5, port: 22, user: root, privateKeyPath: "KEY"}
  - {name: worker3, internalAddress: 192.168.1.6, port: 22, user: root, privateKeyPath: "KEY"}
  roleGroups:
    etcd:
    - master[1:3]
    control-plane:
    - master1
    worker:
    - worker[1:3]
    registry:
    - master1
"""


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "id_rsa"
    path.write_text(
        "-----BEGIN OPENSSH PRIVATE KEY-----\nnot a real key\n-----END OPENSSH PRIVATE KEY-----\n"
    )
    path.chmod(0o600)
    return path


def write(tmp_path: Path, text: str, key: Path) -> Path:
    path = tmp_path / "conf" / "config-sample.conf"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text.replace("KEY", str(key)).replace("/root/.ssh/id_rsa", str(key)))
    return path


def fixed(text: str) -> str:
    """The paste with its indentation corrected the way the fix suggests."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "roleGroups:")
    return "\n".join(lines[:start] + [line[2:] for line in lines[start:]]) + "\n"


def test_the_guides_example_is_the_paste_under_test() -> None:
    if not SEED.exists():
        pytest.skip("the seed guide is not beside this checkout")
    seed = SEED.read_text()
    assert "  roleGroups:" in seed  # the original indents roleGroups under hosts, as GUIDE_PASTE does
    assert GUIDE_PASTE.replace('"KEY"', '"/root/.ssh/id_rsa"') in seed


def test_guide_paste_names_the_indented_line_and_the_fix(tmp_path: Path, key: Path) -> None:
    path = write(tmp_path, GUIDE_PASTE, key)
    result = run_ctl("check", "config", "-f", str(path))
    assert result.rc == 2
    assert f"{path}:8:3: error: `roleGroups:` is indented by 2 spaces" in result.err
    assert "    8 |   roleGroups:" in result.err  # the offending line, with a caret under column 3
    assert "      |   ^" in result.err
    assert "remove the 2 spaces before `roleGroups:`" in result.err
    assert run_ctl("check", "config", "-f", str(write(tmp_path, fixed(GUIDE_PASTE), key))).rc == 0


def test_corrected_guide_example_expands_ranges(tmp_path: Path, key: Path) -> None:
    config = cfg.load(write(tmp_path, fixed(GUIDE_PASTE), key))
    assert config.role_groups == {
        "etcd": ["master1", "master2", "master3"],
        "control-plane": ["master1"],
        "worker": ["worker1", "worker2", "worker3"],
        "registry": ["master1"],
    }
    assert config.name == "master1"  # default CPod name: the first control-plane host
    assert [h.internal_address for h in config.workers] == ["192.168.1.4", "192.168.1.5", "192.168.1.6"]
    assert config.warnings == []


def test_range_expansion() -> None:
    assert cfg.expand("master[1:3]") == ["master1", "master2", "master3"]
    assert cfg.expand("gpu[08:10]") == ["gpu08", "gpu09", "gpu10"]
    assert cfg.expand("node[2:2]-a") == ["node2-a"]
    assert cfg.expand("plain") == ["plain"]
    with pytest.raises(ValueError, match="counts down"):
        cfg.expand("w[3:1]")


def test_role_member_missing_from_hosts(tmp_path: Path, key: Path) -> None:
    text = (
        fixed(GUIDE_PASTE)
        .replace("  - worker[1:3]", "  - worker[1:4]")
        .replace("- master1\n  worker", "- mastr1\n  worker")
    )
    result = run_ctl("check", "config", "-f", str(write(tmp_path, text, key)))
    assert result.rc == 2
    assert ":14:5: error: roleGroups.worker: `worker4` is not in hosts (worker[1:4] expands to" in result.err
    assert ":12:5: error: roleGroups.control-plane: `mastr1` is not in hosts" in result.err
    assert "did you mean `master1`?" in result.err
    assert "2 errors" in result.err
    assert "did you mean `worker3`" not in result.err  # no guess for a range


def test_duplicate_addresses_and_names(tmp_path: Path, key: Path) -> None:
    text = fixed(GUIDE_PASTE).replace("192.168.1.5", "192.168.1.4").replace("name: master3", "name: master2")
    result = run_ctl("check", "config", "-f", str(write(tmp_path, text, key)))
    assert result.rc == 2
    assert (
        ":6:5: error: host `worker2` has the same internalAddress 192.168.1.4 (port 22) as `worker1` "
        "at line 5" in result.err
    )
    assert ":4:5: error: host name `master2` is used twice (first at line 3)" in result.err


def test_structural_rules(tmp_path: Path, key: Path) -> None:
    text = (
        "hosts:\n"
        "  - {name: m1, internalAddress: 10.0.0.1, privateKeyPath: KEY, port: 70000}\n"
        "  - {name: m2, internalAdress: 10.0.0.2, privateKeyPath: KEY}\n"
        "  - {name: Bad_Name, internalAddress: 10.0.0.3, privateKeyPath: KEY}\n"
        "roleGroups:\n"
        "  etcd: [m1, m2]\n"
        "  control-plane: [m1]\n"
        "  registry: [m1]\n"
    )
    result = run_ctl("check", "config", "-f", str(write(tmp_path, text, key)))
    assert result.rc == 2
    assert "port 70000 is not a TCP port" in result.err
    assert "unknown key `internalAdress`" in result.err and "did you mean `internalAddress`?" in result.err
    assert "host name 'Bad_Name' is not a valid node name" in result.err
    assert "roleGroups has no worker host" in result.err


def test_even_etcd_is_a_warning_only(tmp_path: Path, key: Path) -> None:
    text = fixed(GUIDE_PASTE).replace("- master[1:3]", "- master[1:2]")
    result = run_ctl("check", "config", "-f", str(write(tmp_path, text, key)))
    assert result.rc == 0, result.err
    assert "warning: roleGroups.etcd has 2 hosts" in result.err
    assert "use an odd count (1 or 3)" in result.err
    assert "OK — CPod 'master1', 6 hosts" in result.out


def test_key_file_problems(tmp_path: Path, key: Path) -> None:
    key.chmod(0o644)
    result = run_ctl("check", "config", "-f", str(write(tmp_path, fixed(GUIDE_PASTE), key)))
    assert result.rc == 2
    assert f"private key {key} is readable by others (mode 0644)" in result.err
    assert f"fix: chmod 600 {key}" in result.err
    assert result.err.count("readable by others") == 1  # one message per key file, not per host
    public = tmp_path / "id_rsa.pub"
    public.write_text("ssh-rsa AAAA test\n")
    public.chmod(0o600)
    result = run_ctl("check", "config", "-f", str(write(tmp_path, fixed(GUIDE_PASTE), public)))
    assert "is not a private key (this looks like the .pub file)" in result.err


def test_tabs_and_host_field_misplaced(tmp_path: Path, key: Path) -> None:
    tabs = fixed(GUIDE_PASTE).replace("  etcd:", "\tetcd:")
    result = run_ctl("check", "config", "-f", str(write(tmp_path, tabs, key)))
    assert result.rc == 2
    assert ":9:1: error: YAML syntax" in result.err and "replace them with spaces" in result.err
    block = (
        "hosts:\n  - name: m1\n    internalAddress: 10.0.0.1\n    privateKeyPath: KEY\n    roleGroups:\n"
        "      worker: [m1]\n"
    )
    result = run_ctl("check", "config", "-f", str(write(tmp_path, block, key)))
    assert ":5:5: error: `roleGroups:` is indented into a host" in result.err
    assert "start it in column 1, like `hosts:`" in result.err


def test_network_ranges_must_not_hold_hosts(tmp_path: Path, key: Path) -> None:
    text = fixed(GUIDE_PASTE) + "network:\n  podCIDR: 192.168.0.0/16\n"
    result = run_ctl("check", "config", "-f", str(write(tmp_path, text, key)))
    assert result.rc == 2
    assert "host `master1` (192.168.1.1) lies inside the podCIDR 192.168.0.0/16" in result.err


def test_missing_and_empty_files(tmp_path: Path) -> None:
    result = run_ctl("check", "config", "-f", str(tmp_path / "nope.conf"))
    assert result.rc == 2
    assert "does not exist: run `3kctl init -o" in result.err
    (tmp_path / "empty.conf").write_text("")
    assert "the config file is empty" in run_ctl("check", "config", "-f", str(tmp_path / "empty.conf")).err


def test_init_writes_a_sample_that_validates(tmp_path: Path, key: Path) -> None:
    target = tmp_path / "conf" / "config-sample.conf"
    result = run_ctl("init", "-o", str(target))
    assert result.rc == 0, result.err
    assert target.read_text() == SAMPLE_CONFIG
    again = run_ctl("init", "-o", str(target))
    assert again.rc == 2 and "exists" in again.err
    target.write_text(SAMPLE_CONFIG.replace("/root/.ssh/id_rsa", str(key)))
    checked = run_ctl("check", "config", "-f", str(target))
    assert checked.rc == 0, checked.err
    assert "etcd 3, control-plane 1, worker 3, registry 1" in checked.out


def test_default_config_path_is_conf_config_sample(tmp_path: Path) -> None:
    result = run_ctl("check", "config", cwd=tmp_path)
    assert result.rc == 2
    assert "conf/config-sample.conf does not exist" in result.err


def test_contract_flow_example_with_bare_ranges(tmp_path: Path, key: Path) -> None:
    # The guide's sample writes `etcd: [master[1:3]]`, which strict YAML rejects; 3kctl accepts it.
    text = (
        "hosts:\n"
        + "".join(
            f"  - {{name: master{i}, internalAddress: 10.0.0.{i}, privateKeyPath: KEY}}\n" for i in (1, 2, 3)
        )
        + "".join(
            f"  - {{name: worker{i}, internalAddress: 10.0.1.{i}, privateKeyPath: KEY}}\n" for i in (1, 2, 3)
        )
        + "roleGroups:\n  etcd: [master[1:3]]\n  control-plane: [master1]\n  worker: [worker[1:3]]\n"
        + "  registry: [master1]\n"
    )
    config = cfg.load(write(tmp_path, text, key))
    assert config.role_groups["etcd"] == ["master1", "master2", "master3"]
    assert config.role_groups["worker"] == ["worker1", "worker2", "worker3"]
    broken = text.replace("worker: [worker[1:3]]", "worker: [worker[1:4]]")
    result = run_ctl("check", "config", "-f", str(write(tmp_path, broken, key)))
    assert ":11:12: error: roleGroups.worker: `worker4` is not in hosts" in result.err
