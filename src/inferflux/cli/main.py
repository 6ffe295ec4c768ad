"""The `inferflux` console script: `inferflux router` without the server stack.

`inferflux router` is a thin proxy: importing `cli/serve.py` (the API, the engine client,
their grammars) costs it seconds of CPU at every start and memory it never uses. So the
entry point looks at the first argument: `router` runs `cli/router.py` alone, anything
else the full CLI of `cli/serve.py` (which lists `router` in its --help too).
"""

from __future__ import annotations

import sys


def main() -> None:
    """Console-script entry point (`inferflux`)."""
    if sys.argv[1:2] == ["router"]:
        from inferflux.cli.router import router_app

        router_app(args=sys.argv[2:], prog_name="inferflux router")
        return
    # NOTE: libllama before numpy and pyzmq (engine/__init__.py says why); explicit here
    # so that no import cli/serve.py gains ahead of the engine can change that order.
    import inferflux.engine  # noqa: F401
    from inferflux.cli.serve import main as serve_main

    serve_main()
