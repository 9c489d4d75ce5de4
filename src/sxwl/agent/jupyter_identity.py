"""Loaded by a dev environment's JupyterLab (agent/runtimes/jupyter.py), not by the agent.

The cloud's proxy adds Jupyter's token to every request it forwards, and Jupyter would then take
each request for a script's and skip its XSRF and Origin checks. The browser behind the proxy is a
browser, so they stay on (``ProxiedIdentityProvider``): the token signs the request in, and nothing
more. And the token stays with the cloud and the agent: JupyterLab would put it in the page it
serves, for its frontend to send back, so this server extension (loaded after ``jupyterlab``, as
Jupyter loads extensions in the order of their names) takes it out of the page, as JupyterHub's
single-user servers do."""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.identity import IdentityProvider


class ProxiedIdentityProvider(IdentityProvider):
    def should_check_origin(self, handler: Any) -> bool:
        return True

    def is_token_authenticated(self, handler: Any) -> bool:
        return False


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": __name__}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    serverapp.web_app.settings.setdefault("page_config_data", {})["token"] = ""
