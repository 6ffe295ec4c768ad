"""Native routes: `generate` (POST /generate), `chat` (POST /chat), `embeddings`
(POST /embeddings); request and response models in `protocol`, the spec and the events
of a stream in `render`. `api/app.py` mounts the routers."""

__all__: list[str] = []
