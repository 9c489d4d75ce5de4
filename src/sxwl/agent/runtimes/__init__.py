"""Where a CPod runs jobs: ``local`` (processes on this machine)."""
