"""Dev environments in the console: the proxy to their JupyterLab (proxy.py) and their page."""
