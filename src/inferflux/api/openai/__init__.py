"""OpenAI-compatible routes: chat completions, text completions, models."""

from fastapi import APIRouter

from inferflux.api.openai import chat, completions, models

router = APIRouter()
router.include_router(chat.router)
router.include_router(completions.router)
router.include_router(models.router)

__all__ = ["router"]
