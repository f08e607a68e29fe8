"""The chat family: ``POST /v1/chat/completions`` (messages rendered by the model's chat
template; ``max_tokens`` left out is ``default_max_tokens``, within what the context leaves)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from .service import CompletionService


def add_chat_routes(app: FastAPI, service: CompletionService) -> None:
    """Register ``POST /v1/chat/completions`` on ``app``."""

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Any:
        return await service.answer(request, chat=True)
