"""The models family: ``GET /v1/models`` lists the one served name, ``GET /v1/models/{model}``
describes it (404 ``model_not_found`` for any other name)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from .responses import error


def model_card(served: str) -> dict[str, Any]:
    """The OpenAI model object of the served name."""
    return {"id": served, "object": "model", "created": 0, "owned_by": "dpsynth"}


def add_model_routes(app: FastAPI, served: str) -> None:
    """Register the models family's routes on ``app``."""

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card(served)]}

    @app.get("/v1/models/{model:path}", response_model=None)
    def model(model: str) -> Any:
        if model != served:
            return error(404, f"The model '{model}' does not exist: this server serves "
                              f"'{served}'", param="model", code="model_not_found")
        return model_card(served)
