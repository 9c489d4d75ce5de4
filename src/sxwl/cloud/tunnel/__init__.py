"""The cloud's end of the agents' tunnels (docs/tunnel.md): ``hub`` holds them, ``relay`` reaches
those another replica holds, ``service`` is what the rest of the cloud calls."""
