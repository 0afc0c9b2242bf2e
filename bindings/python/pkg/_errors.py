"""weft's exceptions: one class per weft_status code, all subclasses of WeftError."""

__all__ = [
    "WeftError", "InvalidArgumentError", "FailedPreconditionError", "NotFoundError",
    "OutOfRangeError", "UnimplementedError", "DeadlineExceededError", "AbortedError",
    "UnavailableError", "ResourceExhaustedError", "InternalError", "UnknownError",
]


class WeftError(Exception):
    """A failed weft call. `status` is the weft_status code, `message` weft's explanation
    (what was expected, what was found)."""

    status = None

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message

    def __reduce__(self):
        return (type(self), (self.status, self.message))


# The builtin base of each class lets callers catch the usual Python category too
# (a bad shape is also a ValueError, a stall timeout also a TimeoutError).
class InvalidArgumentError(WeftError, ValueError):
    pass


class FailedPreconditionError(WeftError, RuntimeError):
    pass


class NotFoundError(WeftError, LookupError):
    pass


class OutOfRangeError(WeftError, IndexError):
    pass


class UnimplementedError(WeftError, NotImplementedError):
    pass


class DeadlineExceededError(WeftError, TimeoutError):
    pass


class AbortedError(WeftError, RuntimeError):
    pass


class UnavailableError(WeftError, ConnectionError):
    pass


class ResourceExhaustedError(WeftError, MemoryError):
    pass


class InternalError(WeftError, RuntimeError):
    pass


class UnknownError(WeftError, RuntimeError):
    pass


# Indexed by the weft_status values of weft.h (0 is WEFT_OK).
_BY_STATUS = {
    1: InvalidArgumentError,
    2: FailedPreconditionError,
    3: NotFoundError,
    4: OutOfRangeError,
    5: UnimplementedError,
    6: DeadlineExceededError,
    7: AbortedError,
    8: UnavailableError,
    9: ResourceExhaustedError,
    10: InternalError,
    11: UnknownError,
}


def make_error(status, message):
    """The factory the extension calls for every failed weft call."""
    return _BY_STATUS.get(status, UnknownError)(status, message)
