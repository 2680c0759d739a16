"""cubert's exceptions: one class per cube_code.

Every failed call raises a subclass of Error. The exception keeps what the
C error held: the numeric code, its name, the message, the compiler's log
(CompileError) and the causes (SeveralError: one per failed buffer).
"""

import builtins
import re

__all__ = [
    "Error", "InvalidArgumentError", "NotFoundError", "OutOfMemoryError",
    "BufferTooBigError", "PoolCapacityExceededError", "CompileError",
    "ResourceLimitError", "UnsupportedError", "GraphStateError",
    "DeviceFaultError", "SeveralError", "IoError", "UnavailableError",
    "InternalError", "StorageMappingFailedError", "ProfileError",
    "PoolsInUseError", "StreamUnavailableError", "TimeoutError",
    "AbortedError",
]


class Error(Exception):
    """A cubert call failed.

    Attributes: code (int, a cube_code), code_name ("CUBE_ERR_COMPILE"),
    message (str), log (str or None: the compiler's output), causes (list
    of Error).
    """

    code = -1

    def __init__(self, message, *, code=None, code_name=None, log=None,
                 causes=()):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.code_name = code_name or _NAMES.get(self.code, "CUBE_ERR_UNKNOWN")
        self.log = log
        self.causes = list(causes)

    def __str__(self):
        text = f"{self.code_name}: {self.message}"
        if self.log:
            text += _log_excerpt(self.log)
        for cause in self.causes:
            text += "\n  caused by " + str(cause).replace("\n", "\n  ")
        return text


# How many of the log's lines the message carries: the first ones that
# name an error (a compiler's "file:line:col: error: ..."), else the first.
_LOG_LINES = 3
_ERROR_LINE = re.compile(r"\berror\b", re.IGNORECASE)


def _log_excerpt(log):
    """The lines of a compiler's log worth reading in the message itself,
    indented, as cube_error_format shows the log in C; the whole log stays
    in `log`."""
    lines = [line.rstrip() for line in log.splitlines() if line.strip()]
    chosen = [line for line in lines if _ERROR_LINE.search(line)]
    chosen = (chosen or lines)[:_LOG_LINES]
    text = "".join("\n  " + line for line in chosen)
    if len(chosen) < len(lines):
        text += f"\n  ({len(lines) - len(chosen)} more lines in .log)"
    return text


def _define(name, code, *bases):
    cls = type(name, (Error,) + bases, {"code": code, "__module__": __name__})
    return cls


InvalidArgumentError = _define("InvalidArgumentError", 1, ValueError)
NotFoundError = _define("NotFoundError", 2, LookupError)
OutOfMemoryError = _define("OutOfMemoryError", 3, MemoryError)
BufferTooBigError = _define("BufferTooBigError", 4)
PoolCapacityExceededError = _define("PoolCapacityExceededError", 5)
CompileError = _define("CompileError", 6)
ResourceLimitError = _define("ResourceLimitError", 7)
UnsupportedError = _define("UnsupportedError", 8)
GraphStateError = _define("GraphStateError", 9)
DeviceFaultError = _define("DeviceFaultError", 10)
SeveralError = _define("SeveralError", 11)
IoError = _define("IoError", 12)
UnavailableError = _define("UnavailableError", 13)
InternalError = _define("InternalError", 14)
StorageMappingFailedError = _define("StorageMappingFailedError", 15)
ProfileError = _define("ProfileError", 16)
PoolsInUseError = _define("PoolsInUseError", 17)
StreamUnavailableError = _define("StreamUnavailableError", 18)
TimeoutError = _define("TimeoutError", 19, builtins.TimeoutError)
AbortedError = _define("AbortedError", 20)

_BY_CODE = {cls.code: cls for cls in Error.__subclasses__()}
# The C enumerator's name of each code: InvalidArgumentError ->
# CUBE_ERR_INVALID_ARGUMENT.
_NAMES = {
    code: "CUBE_ERR_" + re.sub(r"(?<!^)(?=[A-Z])", "_",
                               cls.__name__[:-len("Error")]).upper()
    for code, cls in _BY_CODE.items()
}


def _from_c(code, description, message, log, causes):
    """Called by the extension: the exception object for one C error
    (`description` is cube_code_name's short text, used for codes newer
    than this module)."""
    cls = _BY_CODE.get(code, Error)
    name = _NAMES.get(code, "CUBE_ERR_" + description.upper().replace(" ", "_"))
    return cls(message, code=code, code_name=name, log=log, causes=causes)
