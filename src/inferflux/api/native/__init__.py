"""Native routes: `generate` (POST /generate), `chat` (POST /chat), `embeddings`
(POST /embeddings); request and response models in `protocol`, the engine round trip in
`generation`. `api/app.py` mounts the routers (importing them here would be circular)."""

__all__: list[str] = []
