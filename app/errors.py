"""One error hierarchy. Each class fixes its HTTP status, OpenAI error type, stable
code and metric label here, and nowhere else."""

from __future__ import annotations

from typing import Any, ClassVar

# The server exits with this code after a fatal device error (illegal memory access,
# device-side assert, launch failure): the CUDA context is poisoned and only a fresh
# process can use the GPU again. The tray's supervisor restarts at once on it.
EXIT_FATAL_DEVICE = 75
EXIT_WEDGED = 76  # an inference thread stopped coming back: only a new process recovers
EXIT_PORT_IN_USE = 74  # another program (or vramgate) has the port: retrying cannot help
EXIT_INVALID_SETTINGS = 2


class DeviceUnavailable(ValueError):
    """The configured device cannot be used (`device = "cuda:1"` on a one-GPU machine):
    a settings error, so the process exits 2 and the supervisor does not retry it."""


class VramgateError(Exception):
    status: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"
    code: ClassVar[str] = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        retry_after: float | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after = retry_after
        self.details = details or {}
        self.counted = False  # in /metrics and /status, and logged (once, wherever first)

    @property
    def metric_label(self) -> str:
        return self.code

    def body(self) -> dict[str, Any]:
        """The OpenAI-style error body, plus our details (queue depth, bytes...)."""
        error: dict[str, Any] = {
            "message": self.message,
            "type": self.error_type,
            "param": self.param,
            "code": self.code,
        }
        error.update(self.details)
        return {"error": error}

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after)))}


class InvalidRequest(VramgateError):
    status = 400
    error_type = "invalid_request_error"
    code = "invalid_request"


class InvalidJson(InvalidRequest):
    code = "invalid_json"


class InvalidImage(InvalidRequest):
    code = "invalid_image"


class InvalidAudio(InvalidRequest):
    """An upload that decodes to no audio (a PDF, an image, cut bytes)."""

    code = "invalid_audio"


class AudioTooLong(InvalidRequest):
    """Audio longer than max_audio_seconds."""

    code = "audio_too_long"


class ImageTooLarge(InvalidRequest):
    status = 413
    code = "image_too_large"


class InvalidImageSize(InvalidRequest):
    """An image size a model cannot make: off its grid, or beyond the size bounds."""

    code = "invalid_size"


class ContextLengthExceeded(InvalidRequest):
    """A prompt (and the answer it asks room for) its model's context cannot hold, with
    OpenAI's code, said in the words each API's clients recognise (litellm, so aider,
    maps them to its context-window error; Claude Code compacts on Anthropic's): OpenAI's
    message (its API's own wording) on OpenAI's routes, `anthropic_message` on
    /v1/messages, `ollama_message` on Ollama's. The numbers stay in each: the prompt's
    tokens, `max_tokens` (None: none asked room for), the context; `advice` is ours."""

    code = "context_length_exceeded"

    def __init__(
        self,
        *,
        context: int,
        prompt: int,
        max_tokens: int | None = None,
        advice: str = "",
        what: str = "messages",
        param: str | None = None,
    ) -> None:
        self.context, self.prompt, self.max_tokens = context, prompt, max_tokens
        self.advice, self.what = advice, what
        details = {"context_length": context, "prompt_tokens": prompt}
        if max_tokens is not None:
            details["max_tokens"] = max_tokens
        super().__init__(self._openai(), param=param, details=details)

    def _openai(self) -> str:
        said = f"This model's maximum context length is {self.context} tokens. However, "
        if self.max_tokens is None:
            said += (
                f"your {self.what} resulted in {self.prompt} tokens. Please reduce the "
                f"length of the {self.what}."
            )
        else:
            said += (
                f"you requested {self.prompt + self.max_tokens} tokens ({self.prompt} in "
                f"the {self.what}, {self.max_tokens} in the completion). Please reduce the "
                f"length of the {self.what} or completion."
            )
        return f"{said} {self.advice}".rstrip()

    @property
    def anthropic_message(self) -> str:
        """Anthropic's own words for either case, as its API sends them."""
        if self.max_tokens is None:
            said = f"prompt is too long: {self.prompt} tokens > {self.context} maximum"
        else:
            said = (
                f"input length and `max_tokens` exceed context limit: {self.prompt} + "
                f"{self.max_tokens} > {self.context}, decrease input length or `max_tokens` "
                "and try again"
            )
        return f"{said}. {self.advice}".rstrip() if self.advice else said

    @property
    def ollama_message(self) -> str:
        """Ollama's words (its runner's errorInputTooLong), with the numbers."""
        asked = "" if self.max_tokens is None else f" and {self.max_tokens} to generate"
        said = (
            f"the input length exceeds the context length: {self.prompt} tokens{asked}, "
            f"the context holds {self.context}"
        )
        return f"{said}. {self.advice}".rstrip() if self.advice else said


class WrongModelKind(InvalidRequest):
    code = "unsupported_model"


class UnsupportedTool(InvalidRequest):
    """A hosted tool (web search, code interpreter, ...) that runs on OpenAI's servers."""

    code = "unsupported_tool"


class InvalidResponseId(InvalidRequest):
    """A response id that is not of the form ours take (checked before it names a file)."""

    code = "invalid_response_id"


class UnsafeSource(InvalidRequest):
    """A pull source that could run code or read files the person did not mean to serve
    (`pip:` with a URL, path or option; a model folder holding a link)."""

    code = "unsafe_source"


class ModelNotFound(VramgateError):
    status = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class ResponseNotFound(ModelNotFound):
    """A stored response (the Responses API's) that is not kept here, or no longer."""

    code = "response_not_found"


class ImageExpired(ModelNotFound):
    """A generated image's link (`response_format: url`) that is not kept here, or no
    longer: links last `image_url_ttl_s`."""

    code = "image_expired"


class PreviousResponseNotFound(ResponseNotFound):
    code = "previous_response_not_found"


class BodyTooLarge(VramgateError):
    status = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class Forbidden(VramgateError):
    status = 403
    error_type = "permission_error"
    code = "forbidden"


class ForbiddenHost(Forbidden):
    """A Host header that is not this machine's loopback name: DNS rebinding."""

    code = "forbidden_host"


class ForbiddenOrigin(Forbidden):
    """A call from a web page of another origin (CSRF, or a page reading the API)."""

    code = "forbidden_origin"


class Conflict(VramgateError):
    """The server's state does not allow it (say why, and what to do)."""

    status = 409
    error_type = "invalid_request_error"
    code = "conflict"


class Unauthorized(VramgateError):
    status = 401
    error_type = "authentication_error"
    code = "unauthorized"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class UnsupportedMediaType(InvalidRequest):
    status = 415
    code = "unsupported_media_type"


class HeadersTooLarge(InvalidRequest):
    status = 431
    code = "headers_too_large"


class ExceedsDevice(VramgateError):
    """The job can never fit on this device, even with nothing else running."""

    status = 413
    error_type = "invalid_request_error"
    code = "exceeds_device_memory"


class Overloaded(VramgateError):
    """Base of the 503s: the caller should come back after Retry-After."""

    status = 503
    error_type = "server_error"
    code = "overloaded"


class QueueFull(Overloaded):
    code = "queue_full"


class AudioMemoryFull(Overloaded):
    """The decoded audio that transcriptions hold (waiting or running) would pass
    `max_audio_bytes` (app.sched.host_bytes)."""

    code = "audio_memory_full"


class ModelLoading(Overloaded):
    code = "model_loading"


class ModelEvicted(ModelLoading):
    """A waiting request's model was unloaded to make room: the service waits for its
    reload and queues the request again (callers see this only past their deadline)."""


class OutOfMemory(Overloaded):
    code = "out_of_memory"


class Paused(Overloaded):
    code = "paused"


class ShuttingDown(Overloaded):
    code = "shutting_down"


class DeviceFailed(Overloaded):
    code = "device_failed"


class RunnerStopped(Overloaded):
    """A model's runner process ended (or stopped answering) under a request: the
    request fails, the server stays up, and the next request reloads the model."""

    code = "model_runner_stopped"


class RunnerFailed(Overloaded):
    """A model's runner answered a valid request with a failure of its own (a 5xx, or an
    error event mid-stream: a decode that failed, a buffer out of memory, its KV pool
    overflowed): the server's fault, never the caller's, so a 503 the caller may retry;
    counted in the model's health (/status `runner_failures`)."""

    code = "model_runner_failed"


class QueueTimeout(VramgateError):
    status = 504
    error_type = "server_error"
    code = "queue_timeout"


class RunTimeout(VramgateError):
    """A job that showed no progress for `run_timeout` seconds on the device."""

    status = 504
    error_type = "server_error"
    code = "run_timeout"


class ClientGone(VramgateError):
    """The caller disconnected; nobody reads this, it only labels the metric."""

    status = 499
    error_type = "client_error"
    code = "client_disconnected"


class InternalError(VramgateError):
    pass
