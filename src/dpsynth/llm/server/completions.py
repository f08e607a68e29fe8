"""The completions family: ``POST /v1/completions`` (a list of prompts is one request of
several completions; ``max_tokens`` defaults to 16, as OpenAI's)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from .service import CompletionService


def add_completion_routes(app: FastAPI, service: CompletionService) -> None:
    """Register ``POST /v1/completions`` on ``app``."""

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Any:
        return await service.answer(request, chat=False)
