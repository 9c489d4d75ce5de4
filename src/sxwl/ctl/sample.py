"""The commented sample config that ``3kctl init`` writes (the guide's example, correctly indented)."""

from __future__ import annotations

SAMPLE_CONFIG = """\
# CPod config for 3kctl (算想云). Fill in your servers, then run `3kctl check config`.
# Top-level keys (hosts, roleGroups, name, ...) start in column 1; YAML allows no tabs.

# Optional: the CPod's name on 算力详情 (default: the first control-plane host's name).
# name: cpod-beijing-1

hosts:
  # One line per server. internalAddress: the address the other nodes reach it on.
  # Optional per host: address (where SSH and KubeKey connect; default internalAddress), arch (amd64 | arm64),
  # password (only for `3kctl ssh setup`; remove it afterwards).
  - {name: master1, internalAddress: 192.168.1.1, port: 22, user: root, privateKeyPath: "/root/.ssh/id_rsa"}
  - {name: master2, internalAddress: 192.168.1.2, port: 22, user: root, privateKeyPath: "/root/.ssh/id_rsa"}
  - {name: master3, internalAddress: 192.168.1.3, port: 22, user: root, privateKeyPath: "/root/.ssh/id_rsa"}
  - {name: worker1, internalAddress: 192.168.1.4, port: 22, user: root, privateKeyPath: "/root/.ssh/id_rsa"}
  - {name: worker2, internalAddress: 192.168.1.5, port: 22, user: root, privateKeyPath: "/root/.ssh/id_rsa"}
  - {name: worker3, internalAddress: 192.168.1.6, port: 22, user: root, privateKeyPath: "/root/.ssh/id_rsa"}

roleGroups:            # column 1, like hosts: (not indented under it)
  etcd:                # an odd count: 1 or 3
    - master[1:3]      # name[a:b] expands to master1, master2, master3
  control-plane:
    - master1
  worker:              # the GPU servers
    - worker[1:3]
  registry:            # exactly one: the private image registry of the offline install
    - master1

# Optional: Rook-Ceph OSD devices for `3kctl deploy install ceph` (default: ask, then every empty disk).
# ceph:
#   devices: [sdb, sdc]

# Optional: Kubernetes version (default: the one in the offline artifact) and networks.
# kubernetes:
#   version: v1.27.16
# network:
#   podCIDR: 10.233.64.0/18
#   serviceCIDR: 10.233.0.0/18
"""
