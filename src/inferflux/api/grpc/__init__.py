"""The gRPC frontend: the inferflux.v1 API (proto/inferflux/v1/inference.proto) as a
bridge into the same app, so every control of the HTTP API applies to it.

- `server.py`: the `grpc.aio` server (health, reflection, TLS), started by the lifespan;
- `bridge.py`: each call → one in-process ASGI request → response messages or a status;
- `routes.py`: the internal routes the bridge calls (404 to anyone else);
- `protocol.py` / `render.py`: request messages → checked bodies; events → messages;
- `gen/`: the code `make proto` generates from the .proto (gitignored).
"""

from inferflux.api.grpc.routes import models_router, router
from inferflux.api.grpc.server import GrpcServer, start_grpc_server

__all__ = ["GrpcServer", "models_router", "router", "start_grpc_server"]
