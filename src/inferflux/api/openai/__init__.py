"""OpenAI-compatible routes: `chat` (/v1/chat/completions), `completions` (/v1/completions),
`models` (/v1/models, /v1/models/{id}), `tokenize` (/tokenize, /detokenize); request models
in `protocol`, accepted-and-ignored and refused parameters in `compat`, the engine round
trip in `generation`, n-choice responses in `responder` (shared envelope and usage in
`envelope`, logprob shapes in `logprobs`). `api/app.py` mounts the routers (importing them
here would be circular: `api/deps.py` imports `protocol`)."""

__all__: list[str] = []
