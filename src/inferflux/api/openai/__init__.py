"""OpenAI-compatible routes: `chat` (/v1/chat/completions), `completions` (/v1/completions),
`models` (/v1/models); request models in `protocol`, the shared engine round trip in
`generation`. `api/app.py` mounts the routers (importing them here would be circular:
`api/deps.py` imports `protocol`)."""

__all__: list[str] = []
