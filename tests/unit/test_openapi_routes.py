"""/openapi.json is kept in step with the handlers: every served route is documented with exactly the
methods its handler implements, and nothing else is; the OpenAI and model routes document OpenAI's error."""
from __future__ import annotations

import pytest

from mindie_service.server.app import PLANE_ROUTES
from mindie_service.server.openapi import SCHEMAS, build_document, handler_methods, openapi_path


@pytest.mark.parametrize("plane", sorted(PLANE_ROUTES))
def test_document_matches_the_routes(plane: str) -> None:
    routes = PLANE_ROUTES[plane]
    doc = build_document(routes, "test")
    served = {openapi_path(p) for p, _ in routes} | {"/openapi.json"}
    assert set(doc["paths"]) == served
    for pattern, cls in routes:
        ops = doc["paths"][openapi_path(pattern)]
        assert set(ops) == set(handler_methods(cls)), pattern
        assert ops, f"{pattern}: a route with no method"
        for op in ops.values():
            assert "default" in op["responses"]  # every route documents its error shape


def test_openai_and_model_routes_use_openais_error_shape() -> None:
    doc = build_document(PLANE_ROUTES["business"], "test")
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/models/{id}", "/v1/responses",
                 "/v1/responses/{id}", "/v1/responses/{id}/cancel", "/v1/responses/{id}/input_items"):
        for op in doc["paths"][path].values():
            ref = op["responses"]["default"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/OpenAIError")
    assert doc["paths"]["/generate"]["post"]["responses"]["default"]["content"]["application/json"]["schema"][
        "$ref"].endswith("/Error")
    # the business port serves the model listings read-only; the management port changes what is served
    assert set(doc["paths"]["/v1/models/{id}"]) == {"get"}
    assert "/v1/models/{id}/start" not in doc["paths"] and "/stopService" not in doc["paths"]
    mgmt = build_document(PLANE_ROUTES["management"], "test")
    assert set(mgmt["paths"]["/v1/models/{id}"]) == {"get", "delete"}
    assert set(mgmt["paths"]["/v1/models/{id}/start"]) == {"put"}
    for op in mgmt["paths"]["/v1/models/{id}/start"].values():
        assert op["responses"]["default"]["content"]["application/json"]["schema"]["$ref"].endswith("/OpenAIError")
    # every $ref resolves
    import json
    for name in set(__import__("re").findall(r'#/components/schemas/(\w+)', json.dumps(doc))):
        assert name in SCHEMAS
