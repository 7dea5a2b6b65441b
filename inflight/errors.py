"""Errors shared by every layer."""

from __future__ import annotations


class ParamError(ValueError):
    """A request parameter is invalid. `param` names the offending field; `code` the error body's
    code where an API names the kind (OpenAI's "unknown_parameter"; None: the status)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code
