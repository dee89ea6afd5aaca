"""The error every serving layer raises, with TF Serving's status codes and their HTTP and gRPC forms."""
from __future__ import annotations

import enum

__all__ = ["Code", "ServingError", "invalid"]


class Code(enum.Enum):
    """A status code: its value is (HTTP status, grpc.StatusCode name), as TF Serving maps them."""

    INVALID_ARGUMENT = (400, "INVALID_ARGUMENT")
    NOT_FOUND = (404, "NOT_FOUND")
    FAILED_PRECONDITION = (412, "FAILED_PRECONDITION")
    RESOURCE_EXHAUSTED = (429, "RESOURCE_EXHAUSTED")
    UNIMPLEMENTED = (501, "UNIMPLEMENTED")
    INTERNAL = (500, "INTERNAL")
    UNAVAILABLE = (503, "UNAVAILABLE")

    @property
    def http_status(self) -> int:
        return self.value[0]

    @property
    def grpc_code(self):
        import grpc

        return getattr(grpc.StatusCode, self.value[1])


class ServingError(Exception):
    """A request that cannot be served: REST answers {"error": message} with code.http_status, gRPC aborts."""

    def __init__(self, code: Code, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(message: str) -> ServingError:
    """The error of a request that is malformed or does not fit the model: INVALID_ARGUMENT."""
    return ServingError(Code.INVALID_ARGUMENT, message)
