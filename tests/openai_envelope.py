"""Assertions on the OpenAI error envelope, shared by unit and integration tests."""

from __future__ import annotations

import httpx


def assert_envelope(
    response: httpx.Response, status: int, *, param: str | None = None, code: str | None = None
) -> dict[str, object]:
    """The response is the OpenAI error envelope with this status (and param/code if given)."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error
