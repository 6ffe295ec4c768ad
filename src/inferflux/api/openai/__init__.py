"""OpenAI-compatible routes: `chat` (/v1/chat/completions), `completions` (/v1/completions),
`models` (/v1/models, /v1/models/{id}), `tokenize` (/tokenize, /detokenize); request models
in `protocol` (each body → a `GenerationSpec` for the generation service), accepted-and-
ignored and refused parameters in `compat`, the n-choice response in `render` (shared
envelope and usage in `envelope`, logprob shapes in `logprobs`). `api/app.py` mounts the
routers."""

__all__: list[str] = []
