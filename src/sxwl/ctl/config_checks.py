"""The checks of the config file: hosts, addresses, keys, role groups and the cluster's settings.
Errors make the config invalid (exit 2); warnings are printed and allowed."""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from sxwl.ctl.cluster import ROLE_GROUPS, ClusterConfig, Host, Mark, expand
from sxwl.ctl.config_reader import TOP_LEVEL_KEYS, NodeReader, kind_of, node_mark, quote_ranges

HOST_KEYS = ("name", "address", "internalAddress", "port", "user", "password", "privateKeyPath", "arch")
ROLE_ALIASES = {"master": "control-plane"}
ARCH_ALIASES = {"amd64": "amd64", "x86_64": "amd64", "arm64": "arm64", "aarch64": "arm64"}

# Kubernetes node names: RFC 1123 subdomain, in practice one lowercase label.
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
HOSTNAME_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9-]{1,63})*$")
CPOD_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
VERSION_RE = re.compile(r"^v?\d+\.\d+\.\d+$")


class Validator(NodeReader):
    """Checks the whole file; ``run`` returns the config (None when it cannot be read at all)."""

    # --- the whole file -------------------------------------------------------------------------------

    def run(self) -> ClusterConfig | None:
        if not self.text.strip():
            self.error("the config file is empty", "run `3kctl init -o FILE` for a commented sample")
            return None
        try:
            root = yaml.compose(quote_ranges(self.text), Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as exc:
            self.yaml_error(exc)
            return None
        if root is None:
            self.error("the config file has no content", "run `3kctl init -o FILE` for a commented sample")
            return None
        top = self.mapping(root, "the config", TOP_LEVEL_KEYS)
        if not top and self.problems:
            return None
        hosts = self.hosts(top["hosts"][1]) if "hosts" in top else []
        if "hosts" not in top:
            self.error("`hosts:` is missing", "list your servers under a top-level `hosts:`", Mark(1, 1))
        groups = self.role_groups(top["roleGroups"][1], hosts) if "roleGroups" in top else {}
        if "roleGroups" not in top:
            self.error(
                "`roleGroups:` is missing",
                "add a top-level `roleGroups:` with etcd, control-plane, worker and registry "
                "(see `3kctl init`)",
                Mark(1, 1),
            )
        config = ClusterConfig(path=self.path, text=self.text, name="", hosts=hosts, role_groups=groups)
        self.extras(top, config)
        if groups:
            self.roles(config, top["roleGroups"][1])
        name_node = top.get("name")
        if name_node is not None:
            name = self.string(name_node[1], "name")
            if name is not None and not CPOD_NAME_RE.match(name):
                self.error(
                    f"name {name!r} is not a valid CPod name",
                    "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
                    name_node[1],
                )
            config.name = name or ""
        elif config.control_planes:
            config.name = config.control_planes[0].name
        return config

    # --- hosts --------------------------------------------------------------------------------------

    def hosts(self, node: Node) -> list[Host]:
        if not isinstance(node, SequenceNode):
            self.error(
                f"hosts must be a list, found {kind_of(node)}",
                "write each host as `  - {name: ..., internalAddress: ...}` under `hosts:`",
                node,
            )
            return []
        if not node.value:
            self.error("hosts is empty", "add your servers, one `- {name: ...}` per line", node)
        hosts: list[Host] = []
        names: dict[str, int] = {}
        addresses: dict[str, tuple[str, int]] = {}
        for item in node.value:
            host = self.host(item)
            if host is None:
                continue
            if host.name in names:
                self.error(
                    f"host name `{host.name}` is used twice (first at line {names[host.name]})",
                    "every host needs its own name",
                    item,
                )
                continue
            key = f"{host.internal_address}:{host.port}"
            if key in addresses:
                other, line = addresses[key]
                self.error(
                    f"host `{host.name}` has the same internalAddress {host.internal_address} (port "
                    f"{host.port}) as `{other}` at line {line}",
                    "each server is listed once; correct the address of one of them",
                    item,
                )
                continue
            names[host.name] = host.line
            addresses[key] = (host.name, host.line)
            hosts.append(host)
        return hosts

    def host(self, node: Node) -> Host | None:
        where = f"host #{node_mark(node).line}"
        items = self.mapping(node, "host", HOST_KEYS)
        if not isinstance(node, MappingNode):
            return None
        values: dict[str, Any] = {}
        for key, (_, value_node) in items.items():
            values[key] = value_node
        name = self.string(values["name"], "host name") if "name" in values else None
        if "name" not in values:
            self.error("a host has no `name`", "add `name: master1` (the node's name)", node)
        if name is not None:
            where = f"host `{name}`"
            if not NAME_RE.match(name):
                self.error(
                    f"host name {name!r} is not a valid node name",
                    "use lowercase letters, digits and '-' (at most 63), starting and ending with a "
                    "letter or digit",
                    values["name"],
                )
        internal = None
        if "internalAddress" in values:
            internal = self.address(values["internalAddress"], f"{where}: internalAddress")
        else:
            self.error(
                f"{where} has no `internalAddress`",
                "add `internalAddress: <the address other nodes reach it on>`",
                node,
            )
        address = self.address(values["address"], f"{where}: address") if "address" in values else internal
        port = 22
        if "port" in values:
            raw = self.scalar(values["port"])
            if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= 65535:
                self.error(
                    f"{where}: port {raw!r} is not a TCP port", "use 1-65535 (SSH is 22)", values["port"]
                )
            else:
                port = raw
        user = self.string(values["user"], f"{where}: user") if "user" in values else "root"
        password = None
        if "password" in values:
            raw_password = self.scalar(values["password"])
            password = None if raw_password is None else str(raw_password)
        arch = "amd64"
        if "arch" in values:
            raw_arch = self.string(values["arch"], f"{where}: arch")
            if raw_arch is not None and raw_arch not in ARCH_ALIASES:
                self.error(
                    f"{where}: arch {raw_arch!r} is not supported", "use amd64 or arm64", values["arch"]
                )
            elif raw_arch is not None:
                arch = ARCH_ALIASES[raw_arch]
        key_path = None
        if "privateKeyPath" in values:
            raw_key = self.string(values["privateKeyPath"], f"{where}: privateKeyPath")
            if raw_key is not None:
                key_path = self.key_path(raw_key, where, values["privateKeyPath"])
        elif password is None:
            self.error(
                f"{where} has neither `privateKeyPath` nor `password`",
                'add `privateKeyPath: "/root/.ssh/id_rsa"` (and run `3kctl ssh setup`)',
                node,
            )
        if name is None or internal is None or address is None or user is None:
            return None
        return Host(
            name=name,
            internal_address=internal,
            address=address,
            port=port,
            user=user,
            private_key_path=key_path,
            password=password,
            arch=arch,
            line=node_mark(node).line,
        )

    def address(self, node: Node, where: str) -> str | None:
        value = self.string(node, where)
        if value is None:
            return None
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            pass
        if re.match(r"^[\d.]+$", value) or not HOSTNAME_RE.match(value):
            self.error(f"{where} {value!r} is neither an IP address nor a host name", "", node)
            return None
        return value

    def key_path(self, raw: str, where: str, node: Node) -> Path:
        path = Path(os.path.expanduser(raw))
        if not path.is_absolute():
            path = self.path.resolve().parent / path
        if not self.check_keys or path in self.checked_keys:
            return path  # one message per key file, however many hosts share it
        self.checked_keys.add(path)
        try:
            info = path.stat()
        except FileNotFoundError:
            self.error(
                f"{where}: private key {path} does not exist",
                "run `3kctl ssh setup` to create it and install it on every host, or fix the path",
                node,
            )
            return path
        except PermissionError:
            self.error(f"{where}: cannot read {path}", "run 3kctl as the key's owner (or with sudo)", node)
            return path
        if not stat.S_ISREG(info.st_mode):
            self.error(f"{where}: {path} is not a file", "point privateKeyPath at the private key file", node)
            return path
        if info.st_mode & 0o077:
            self.error(
                f"{where}: private key {path} is readable by others (mode {stat.S_IMODE(info.st_mode):04o})",
                f"chmod 600 {path}",
                node,
            )
        try:
            head = path.read_bytes()[:100]
        except PermissionError:
            self.error(f"{where}: cannot read {path}", "run 3kctl as the key's owner (or with sudo)", node)
            return path
        if b"PRIVATE KEY" not in head:
            hint = " (this looks like the .pub file)" if head.startswith(b"ssh-") else ""
            self.error(
                f"{where}: {path} is not a private key{hint}",
                "point privateKeyPath at the private key, e.g. /root/.ssh/id_rsa",
                node,
            )
        return path

    # --- roleGroups -----------------------------------------------------------------------------------

    def role_groups(self, node: Node, hosts: list[Host]) -> dict[str, list[str]]:
        allowed = ROLE_GROUPS + tuple(ROLE_ALIASES)
        items = self.mapping(node, "roleGroups", allowed)
        known = {h.name for h in hosts}
        groups: dict[str, list[str]] = {}
        for key, (key_node, value_node) in items.items():
            role = ROLE_ALIASES.get(key, key)
            if role != key:
                self.warn(
                    f"roleGroups: `{key}` is the old name of `{role}`", f"rename it to `{role}`", key_node
                )
            if role in groups:
                self.error(f"roleGroups: `{role}` is given twice", "merge the two lists", key_node)
                continue
            members = self.members(role, value_node, known)
            groups[role] = members
        return groups

    def members(self, role: str, node: Node, known: set[str]) -> list[str]:
        if isinstance(node, ScalarNode) and self.scalar(node) is None:
            return []
        if isinstance(node, ScalarNode):
            items = [node]  # `worker: worker1` — accept one name without a list
        elif isinstance(node, SequenceNode):
            items = list(node.value)
        else:
            self.error(f"roleGroups.{role} must be a list of host names, found {kind_of(node)}", "", node)
            return []
        names: list[str] = []
        if items:
            self.listed_roles.add(role)
        for item in items:
            raw = self.string(item, f"roleGroups.{role} entry")
            if raw is None:
                continue
            try:
                expanded = expand(raw)
            except ValueError as exc:
                self.error(f"roleGroups.{role}: {raw}: {exc}", "", item)
                continue
            missing = [n for n in expanded if n not in known]
            if missing:
                close = difflib.get_close_matches(missing[0], sorted(known), n=1, cutoff=0.6)
                listed = ", ".join(sorted(known)) or "none"
                what = f"`{missing[0]}`" if len(missing) == 1 else f"{', '.join(missing)}"
                fix = f"did you mean `{close[0]}`? " if close and len(expanded) == 1 else ""
                self.error(
                    f"roleGroups.{role}: {what} {'is' if len(missing) == 1 else 'are'} not in hosts"
                    + (f" ({raw} expands to {', '.join(expanded)})" if len(expanded) > 1 else ""),
                    f"{fix}add {'it' if len(missing) == 1 else 'them'} to `hosts:` or correct the name "
                    f"(hosts: {listed})",
                    item,
                )
            for name in expanded:
                if name in names:
                    self.warn(f"roleGroups.{role}: `{name}` is listed twice", "list each host once", item)
                elif name in known:
                    names.append(name)
        return names

    def roles(self, config: ClusterConfig, node: Node) -> None:
        groups = config.role_groups
        mark = node_mark(node)
        for role, fix in (
            ("control-plane", "add `control-plane: [master1]` (1 or 3 hosts)"),
            ("worker", "add `worker: [worker1]` with the GPU servers"),
            ("etcd", "add `etcd: [master1]` (an odd count: 1 or 3)"),
            ("registry", "add `registry: [master1]`: the private image registry of the offline install"),
        ):
            if role not in self.listed_roles:
                self.error(f"roleGroups has no {role} host", fix, mark)
        etcd = groups.get("etcd", [])
        if etcd and len(etcd) % 2 == 0:
            self.warn(
                f"roleGroups.etcd has {len(etcd)} hosts; etcd needs a majority, so {len(etcd)} hosts survive "
                f"no more failures than {len(etcd) - 1}",
                f"use an odd count ({len(etcd) - 1} or {len(etcd) + 1})",
                mark,
            )
        registry = groups.get("registry", [])
        if len(registry) > 1:
            self.error(
                f"roleGroups.registry has {len(registry)} hosts",
                "KubeKey installs one registry: keep one",
                mark,
            )
        for host in config.hosts:
            if not config.roles_of(host.name):
                self.warn(
                    f"host `{host.name}` has no role, so it will not be part of the CPod",
                    "add it to roleGroups (worker, control-plane …) or remove it",
                    Mark(host.line, 1),
                )

    # --- optional sections ----------------------------------------------------------------------------

    def extras(self, top: dict[str, tuple[Node, Node]], config: ClusterConfig) -> None:
        if "ceph" in top:
            items = self.mapping(top["ceph"][1], "ceph", ("devices",))
            if "devices" in items:
                node = items["devices"][1]
                if not isinstance(node, SequenceNode):
                    self.error("ceph.devices must be a list, e.g. [sdb, sdc]", "", node)
                else:
                    for item in node.value:
                        device = self.string(item, "ceph.devices entry")
                        if device is not None:
                            device = device.removeprefix("/dev/")
                            if not re.match(r"^[A-Za-z0-9._/-]+$", device):
                                self.error(f"ceph.devices: {device!r} is not a device name", "e.g. sdb", item)
                            config.ceph_devices.append(device)
        if "kubernetes" in top:
            items = self.mapping(top["kubernetes"][1], "kubernetes", ("version",))
            if "version" in items:
                version = self.string(items["version"][1], "kubernetes.version")
                if version is not None and not VERSION_RE.match(version):
                    self.error(
                        f"kubernetes.version {version!r} is not a version",
                        "e.g. v1.27.16",
                        items["version"][1],
                    )
                elif version is not None:
                    config.kubernetes_version = version if version.startswith("v") else f"v{version}"
        if "network" in top:
            items = self.mapping(top["network"][1], "network", ("podCIDR", "serviceCIDR"))
            nets: dict[str, ipaddress.IPv4Network | ipaddress.IPv6Network] = {}
            for key in ("podCIDR", "serviceCIDR"):
                if key not in items:
                    continue
                value = self.string(items[key][1], f"network.{key}")
                if value is None:
                    continue
                try:
                    nets[key] = ipaddress.ip_network(value, strict=True)
                except ValueError as exc:
                    self.error(f"network.{key}: {exc}", "e.g. 10.233.64.0/18", items[key][1])
                    continue
                setattr(config, "pod_cidr" if key == "podCIDR" else "service_cidr", str(nets[key]))
            if len(nets) == 2 and _overlap(nets["podCIDR"], nets["serviceCIDR"]):
                self.error(
                    "network.podCIDR and network.serviceCIDR overlap",
                    "choose disjoint ranges",
                    Mark(node_mark(items["serviceCIDR"][1]).line, node_mark(items["serviceCIDR"][1]).column),
                )
        for cidr, key in ((config.pod_cidr, "podCIDR"), (config.service_cidr, "serviceCIDR")):
            net = ipaddress.ip_network(cidr)
            for host in config.hosts:
                try:
                    inside = ipaddress.ip_address(host.internal_address) in net
                except ValueError:
                    continue
                if inside:
                    self.error(
                        f"host `{host.name}` ({host.internal_address}) lies inside the {key} {cidr}",
                        f"set `network: {{{key}: ...}}` to a range your hosts do not use",
                        Mark(host.line, 1),
                    )


def _overlap(
    a: ipaddress.IPv4Network | ipaddress.IPv6Network, b: ipaddress.IPv4Network | ipaddress.IPv6Network
) -> bool:
    return a.version == b.version and a.overlaps(b)
