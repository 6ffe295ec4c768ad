"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`): the `anthropic`
SDK and the coding agents built on it work unchanged. `protocol` (request bodies →
the generation service's terms), `render` (the message and its named SSE events),
`messages` (the routes). `api/app.py` mounts the router."""

__all__: list[str] = []
