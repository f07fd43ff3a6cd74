"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}`, and the handlers that
turn every client mistake into a 4xx with that body (never a 500, and never FastAPI's 422)."""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

logger = logging.getLogger(__name__)

# OpenAI's `type` for each status we emit; anything else is reported as a server error.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    """An error with an HTTP status, raised anywhere in request handling."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


class ErrorResponse(JSONResponse):
    """An error body as ASCII JSON: an echoed value holding a lone surrogate (U+D800, which
    JSON allows and UTF-8 cannot encode) then reads as an escape, where the UTF-8 rendering
    raised inside the error handler and the client got a bare 500."""

    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _ERROR_TYPES.get(status, "server_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None,
                   code: str | None = None) -> JSONResponse:
    return ErrorResponse(error_body(status, message, param, code), status_code=status)


def _describe_validation_error(exc: RequestValidationError) -> tuple[str, str | None]:
    """One readable sentence and the offending parameter, from pydantic's error list."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return f"the request body is not valid JSON: {detail}".rstrip(": "), None
    # FastAPI prefixes the location with "body"; the client knows the body only as fields.
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    # Model validators raise ValueError; pydantic prefixes their message with "Value error, ".
    message = first.get("msg", "invalid value").removeprefix("Value error, ")
    if param is None and first.get("type") in ("model_attributes_type", "dict_type"):
        message = "the request body must be a JSON object"
    elif param is None and first.get("type") == "missing":
        message = "the request body is empty"
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    return (f"{param}: {message}{more}" if param else f"{message}{more}"), param


async def _on_api_error(_: Request, exc: APIError) -> JSONResponse:
    return error_response(exc.status, exc.message, exc.param, exc.code)


async def _on_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    message, param = _describe_validation_error(exc)
    return error_response(400, message, param)


async def _on_http_exception(_: Request, exc: HTTPException) -> JSONResponse:
    # Routing errors (404 unknown path, 405 wrong method) get the OpenAI shape too.
    try:
        phrase = HTTPStatus(exc.status_code).phrase
    except ValueError:
        phrase = "error"
    message = exc.detail if isinstance(exc.detail, str) else phrase
    return ErrorResponse(error_body(exc.status_code, message), status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))


async def _on_unexpected(_: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error while serving a request", exc_info=exc)
    return error_response(500, "internal server error")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(HTTPException, _on_http_exception)
    app.add_exception_handler(Exception, _on_unexpected)


def lone_surrogate_at(data: Any) -> str | None:
    """The top-level field of a parsed JSON body that holds a string UTF-8 cannot carry (a
    lone surrogate), in a key or a value at any depth; None if there is none."""
    for name, value in data.items() if isinstance(data, dict) else [("body", data)]:
        stack = [name, value]
        while stack:
            v = stack.pop()
            if isinstance(v, str):
                if not v.isascii() and not is_utf8(v):
                    return str(name) if is_utf8(name) else "body"
            elif isinstance(v, dict):
                stack.extend(v.keys())
                stack.extend(v.values())
            elif isinstance(v, list):
                stack.extend(x for x in v if isinstance(x, (str, dict, list)))
    return None


def is_utf8(text: Any) -> bool:
    """Whether text is a string UTF-8 can carry (a lone surrogate it cannot)."""
    if not isinstance(text, str):
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
