"""Errors shared by every layer."""

from __future__ import annotations


class ParamError(ValueError):
    """A request parameter is invalid. `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
