"""One exception hierarchy for the whole service, each class mapped to an HTTP status and a TGI
``error_type``. Handlers never build error JSON by hand: they raise one of these and the server
turns it into ``{"error": message, "error_type": type}`` with ``status``."""
from __future__ import annotations


class MindieError(Exception):
    """Base of every error the service reports to a client."""

    status: int = 500
    error_type: str = "incomplete_generation"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_json(self) -> dict[str, str]:
        return {"error": self.message, "error_type": self.error_type}


class ValidationError(MindieError, ValueError):
    """Bad input: 422. Also a ValueError so the offline API raises what Python users expect."""

    status = 422
    error_type = "validation"


class ContextLengthError(ValidationError):
    """A prompt over the input-length limit: 422 (OpenAI's 400 with ``code: "context_length_exceeded"``)."""

    code = "context_length_exceeded"


class MediaError(ValidationError):
    """A media part could not be fetched or decoded. ``status`` may be 4xx other than 422
    (e.g. 403 for a refused source, 413 for a body over its cap, 504 for a fetch timeout)."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


class BadRequestError(MindieError):
    """Malformed JSON or wrong content type: 400."""

    status = 400
    error_type = "validation"


class ForbiddenError(MindieError):
    """A request this server refuses whoever sends it that way (e.g. a cross-site form post): 403."""

    status = 403
    error_type = "forbidden"


class UnauthorizedError(MindieError):
    """No API key, or one this plane does not accept: 401 with ``WWW-Authenticate: Bearer``."""

    status = 401
    error_type = "unauthorized"


class NotFoundError(MindieError):
    status = 404
    error_type = "not_found"


class ModelNotFoundError(NotFoundError):
    """A ``model`` (OpenAI routes) or model id (catalog routes) that names no catalog model or adapter: 404."""

    error_type = "model_not_found"


class MethodNotAllowedError(MindieError):
    status = 405
    error_type = "method_not_allowed"


class ConflictError(MindieError):
    status = 409
    error_type = "conflict"


class PayloadTooLargeError(MindieError):
    status = 413
    error_type = "validation"


class OverloadedError(MindieError):
    status = 429
    error_type = "overloaded"


class GenerationError(MindieError):
    """The engine failed this request (the server keeps serving others): 424."""

    status = 424
    error_type = "generation"


class ModelLoadError(MindieError):
    """The model a request names failed to load (its ``load_error``): 424, until the management port starts it
    again (a failed load is not retried by every request)."""

    status = 424
    error_type = "model_load_failed"


class IncompleteGenerationError(MindieError):
    """The engine stopped before this request finished (engine thread or a rank died): 500."""

    status = 500
    error_type = "incomplete_generation"


class EngineDeadError(IncompleteGenerationError):
    """Raised inside the engine when it cannot go on for anyone (a tensor-parallel rank died, device lost):
    the step does not isolate it per request; the engine thread stops and fails every request in flight."""


class TimeoutError_(MindieError):
    """e2eTimeout or tokenTimeout passed: 504."""

    status = 504
    error_type = "timeout"


class UnhealthyError(MindieError):
    status = 503
    error_type = "healthcheck"


class ConfigError(ValueError):
    """An invalid config.json (or a file it names): stops start-up. Not a client error."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("invalid configuration:\n  " + "\n  ".join(self.problems))


class ExistingFilesError(ValueError):
    """A command would replace files that exist (``gen-certs`` without ``--force``): it writes nothing."""


def check(cond: bool, param: str, rule: str, value: object) -> None:
    """Raise a ValidationError naming the parameter, the rule and the value given."""
    if not cond:
        raise ValidationError(f"Parameter {param} must be {rule}, got {value!r}")
