"""weft's exceptions: one class per weft_status code, all subclasses of WeftError."""

__all__ = [
    "WeftError", "InvalidArgumentError", "FailedPreconditionError", "NotFoundError",
    "OutOfRangeError", "UnimplementedError", "DeadlineExceededError", "AbortedError",
    "UnavailableError", "ResourceExhaustedError", "InternalError", "UnknownError",
    "UnsupportedDTypeError",
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
    """A bad argument: shape, dtype, rank, weight, name or option (also a ValueError)."""


class FailedPreconditionError(WeftError, RuntimeError):
    """A call at the wrong time: before init(), with ops in flight, after a lost call order
    (also a RuntimeError)."""


class NotFoundError(WeftError, LookupError):
    """No such window or named object (also a LookupError)."""


class OutOfRangeError(WeftError, IndexError):
    """A buffer or index out of range (also an IndexError)."""


class UnimplementedError(WeftError, NotImplementedError):
    """Not supported by this build or device (also a NotImplementedError)."""


class UnsupportedDTypeError(UnimplementedError, TypeError):
    """An array whose dtype weft does not exchange (complex, bool, ...): also a TypeError,
    as NumPy and torch raise for a wrong dtype."""


class DeadlineExceededError(WeftError, TimeoutError):
    """A stall passed WEFT_STALL_TIMEOUT_SECONDS (also a TimeoutError)."""


class AbortedError(WeftError, RuntimeError):
    """The op was abandoned: shutdown, or a peer failed (also a RuntimeError)."""


class UnavailableError(WeftError, ConnectionError):
    """A peer or transport is unreachable (also a ConnectionError)."""


class ResourceExhaustedError(WeftError, MemoryError):
    """Out of memory (also a MemoryError)."""


class InternalError(WeftError, RuntimeError):
    """A bug in weft or in the library below it (also a RuntimeError)."""


class UnknownError(WeftError, RuntimeError):
    """An error weft cannot classify (also a RuntimeError)."""


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
