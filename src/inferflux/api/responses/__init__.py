"""OpenAI's Responses API (`/v1/responses`, over HTTP and as a WebSocket): the `openai`
SDK's `client.responses` works unchanged. `protocol` (request bodies → the generation
service's terms), `render` (the response object and its typed SSE events), `store`
(responses kept per owner for `previous_response_id` and GET), `routes` (HTTP),
`socket` (WebSocket mode). `api/app.py` mounts the routers."""

__all__: list[str] = []
