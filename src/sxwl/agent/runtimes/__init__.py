"""Where a CPod runs its jobs, behind one protocol (base.Runtime): ``local`` (process groups in
bubblewrap sandboxes on this machine) and ``kubernetes`` (Kubernetes Jobs in per-tenant
namespaces)."""
