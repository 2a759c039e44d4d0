"""flightlock: per-record locks for AWS Lambda handlers, through the flightlock layer's lock API.

The core (this module) is the Python standard library only. `flightlock.powertools` fits it to
Powertools for AWS Lambda's batch utility (it imports aws_lambda_powertools when used).
"""

from flightlock._locks import (
    ALREADY_HELD,
    BAD_REQUEST,
    BUSY,
    FORBIDDEN,
    LOCK_ERROR,
    LOST,
    METHOD_NOT_ALLOWED,
    NO_DECISION,
    NOT_CONFIGURED,
    NOT_FOUND,
    NOT_HELD,
    NOT_IN_FLIGHT,
    PERMITS_MISMATCH,
    PROTOCOL_TOO_NEW,
    REFUSALS,
    TOKEN_HEADER,
    TOO_LARGE,
    TOO_MANY_LOCKS,
    UNAUTHORIZED,
    UNAVAILABLE,
    WRAPPED,
    WRAPPER,
    HeldLock,
    LambdaContext,
    LockApiError,
    LockApiUnavailable,
    LockBusy,
    Locks,
)

#: The flightlock release this client belongs to (the layer's version; the Cargo workspace's).
__version__ = "0.1.0"

__all__ = [
    "ALREADY_HELD",
    "BAD_REQUEST",
    "BUSY",
    "FORBIDDEN",
    "LOCK_ERROR",
    "LOST",
    "METHOD_NOT_ALLOWED",
    "NOT_CONFIGURED",
    "NOT_FOUND",
    "NOT_HELD",
    "NOT_IN_FLIGHT",
    "NO_DECISION",
    "PERMITS_MISMATCH",
    "PROTOCOL_TOO_NEW",
    "REFUSALS",
    "TOKEN_HEADER",
    "TOO_LARGE",
    "TOO_MANY_LOCKS",
    "UNAUTHORIZED",
    "UNAVAILABLE",
    "WRAPPED",
    "WRAPPER",
    "HeldLock",
    "LambdaContext",
    "LockApiError",
    "LockApiUnavailable",
    "LockBusy",
    "Locks",
    "__version__",
]
