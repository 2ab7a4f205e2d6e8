"""A route whose handler is one call with its path's parameters, added from a line of a table.

The handler's signature names the path's parameters (strings), so FastAPI reads them, and the
OpenAPI document lists them, as it does for a handler written out by hand."""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import Response

PATH_PARAMETER = re.compile(r"{(\w+)}")


def add_path_route(
    app: FastAPI,
    method: str,
    path: str,
    name: str,
    answer: Callable[..., Awaitable[Response]],
    *,
    include_in_schema: bool = True,
) -> None:
    """`method path` (operation `name`) answering `answer(request, *path parameters in order)`."""
    names = PATH_PARAMETER.findall(path)

    async def endpoint(request: Request, **parameters: str) -> Response:
        return await answer(request, *(parameters[each] for each in names))

    keyword = inspect.Parameter.KEYWORD_ONLY
    endpoint.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request)]
        + [inspect.Parameter(each, keyword, annotation=str) for each in names]
    )
    app.add_api_route(
        path, endpoint, methods=[method], name=name, include_in_schema=include_in_schema
    )
