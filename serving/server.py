"""The prediction image's HTTP server: any exported SavedModel behind Vertex AI's custom-container contract.

    python -m serving.server [--model-dir DIR] [--signature NAME] [--host H] [--port P] [limits]

Vertex AI's "Custom container requirements for prediction"
(https://cloud.google.com/vertex-ai/docs/predictions/custom-container-requirements) is what it meets:
- it listens on AIP_HTTP_PORT (the Model's containerSpec.ports; 8080 by default), on 0.0.0.0 in
  the image (`--host`; the default here, 127.0.0.1, keeps a run outside a container to this machine);
- AIP_HEALTH_ROUTE answers 200 once the model is loaded and a warm-up call was made (serving.predictor.load), 503
  before: the port opens at once (Vertex's liveness probe is a TCP connect) while the model loads;
- AIP_PREDICT_ROUTE takes TensorFlow Serving's row format, `{"instances": [...]}`, one value per
  input of the signature the server serves (serving/instances.py), and answers
  `{"predictions": [...]}`, what the signature returns for each instance (serving/answers.py), as
  Vertex's prebuilt TensorFlow containers answer: an image classifier's
  `{"instances": [{"image_bytes": {"b64": ...}}]}` gets `{"predictions": [{"class_name": ...,
  "probabilities": [...]}]}`, a regression on a table's columns `{"predictions": [12.5]}`. What the
  server knows of the model it reads from the SavedModel's signature (serving/model.py); the rest
  is configuration: --signature, and the limits below;
- the model comes from AIP_STORAGE_URI (Vertex's copy of the Model's artifactUri, a gs:// path),
  read by TensorFlow's own Cloud Storage file system, as training writes it: no other client;
- SIGTERM stops it cleanly: no new connections, the requests in progress answered (for up to
  GRACE_SECONDS), exit code 0.
Flags override the variables, so one image runs anywhere.

A bad request is answered 400, 408 or 413 with `{"error": "<one line>"}` (serving/instances.py
says what is checked), and the server goes on serving; no response carries a stack trace. What a
client can make it hold is bounded: the body (--max-request-bytes, refused by its Content-Length
before it is read), the instances in one request (--max-instances), the pixels one image may decode
to (--max-image-pixels, read from its header, serving/images.py), the time a client may take to send a request head
or a body or to stay idle (--client-timeout), and the connections served at once
(--max-connections; more are answered 503). Connections are served by one event loop, so a slow
or idle client holds up no other. A connection the server ends while its client may still be
sending is closed lingering (_LingeringClose), so that the client reads its answer, not a reset.

Logging: progress on stdout, problems on stderr (which Cloud Logging shows as ERROR), so a healthy
start writes nothing to stderr (TensorFlow's load-time lines are left out: serving/quiet_tensorflow.py).
Bad requests are the client's problem and are not logged; --access-log logs every request on stdout.

It imports nothing of trainer/ or of any example: the prediction image carries serving/ alone.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from typing import Mapping, Sequence

from serving import flags, instances, model as model_lib

DEFAULT_PORT = 8080  # Vertex's default containerSpec port
DEFAULT_HEALTH_ROUTE = "/health"
DEFAULT_PREDICT_ROUTE = "/predict"
# Vertex AI's dedicated endpoints forward bodies of up to 10 MB, its shared public endpoints 1.5 MB.
DEFAULT_MAX_REQUEST_BYTES = 10 * 1024 * 1024
DEFAULT_MAX_INSTANCES = 64
DEFAULT_CLIENT_TIMEOUT = 30.0
DEFAULT_MAX_CONNECTIONS = 64
# After SIGTERM, how long requests in progress may take; Kubernetes, which Vertex's prediction
# nodes run on, kills a container 30 s after its SIGTERM by default.
GRACE_SECONDS = 20
# Instances answered through one call of the model: serving.predict's batch.
DEFAULT_MAX_BATCH = 32

log = logging.getLogger("serving")


class ConfigError(ValueError):
    """A setting the server cannot start with; str() is one line."""


@dataclasses.dataclass(frozen=True)
class Settings:
    model_dir: str
    signature: str
    host: str
    port: int
    health_route: str
    predict_route: str
    max_request_bytes: int
    max_instances: int
    max_image_pixels: int
    client_timeout: float
    max_connections: int
    max_batch: int
    access_log: bool


def build_parser(environ: Mapping[str, str] = os.environ) -> argparse.ArgumentParser:
    """The flags, each defaulting to the variable Vertex AI sets for it."""
    parser = flags.OneLineParser(prog="python -m serving.server", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model-dir", default=environ.get("AIP_STORAGE_URI"),
                        help="the exported SavedModel, local or gs://; AIP_STORAGE_URI when it is set")
    parser.add_argument("--signature", default=model_lib.DEFAULT_SIGNATURE,
                        help="the SavedModel's signature to serve; its inputs and outputs are read from it")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (the image passes 0.0.0.0)")
    parser.add_argument("--port", default=environ.get("AIP_HTTP_PORT", str(DEFAULT_PORT)), help="AIP_HTTP_PORT when it is set")
    parser.add_argument("--health-route", default=environ.get("AIP_HEALTH_ROUTE", DEFAULT_HEALTH_ROUTE),
                        help="AIP_HEALTH_ROUTE when it is set")
    parser.add_argument("--predict-route", default=environ.get("AIP_PREDICT_ROUTE", DEFAULT_PREDICT_ROUTE),
                        help="AIP_PREDICT_ROUTE when it is set")
    limits = parser.add_argument_group("limits on what one client can make the server hold")
    limits.add_argument("--max-request-bytes", type=flags.positive_int, default=DEFAULT_MAX_REQUEST_BYTES,
                        help="larger bodies are answered 413 without being read")
    limits.add_argument("--max-instances", type=flags.positive_int, default=DEFAULT_MAX_INSTANCES,
                        help="instances in one request")
    limits.add_argument("--max-image-pixels", type=flags.positive_int, default=instances.DEFAULT_MAX_IMAGE_PIXELS,
                        help="width x height of one image, read from its header before it is decoded")
    limits.add_argument("--client-timeout", type=flags.positive_float, default=DEFAULT_CLIENT_TIMEOUT, metavar="SECONDS",
                        help="to send a request head, to send a body, or to keep an idle connection")
    limits.add_argument("--max-connections", type=flags.positive_int, default=DEFAULT_MAX_CONNECTIONS,
                        help="served at once; requests on more are answered 503")
    parser.add_argument("--max-batch", type=flags.positive_int, default=DEFAULT_MAX_BATCH,
                        help="instances answered through one call of the model, from requests that arrive together")
    parser.add_argument("--access-log", action="store_true", help="log every request on stdout")
    return parser


def settings_from(argv: Sequence[str] | None, environ: Mapping[str, str] = os.environ) -> Settings:
    """Flags and Vertex's variables -> Settings; raises ConfigError (one line), or SystemExit(2)
    for a malformed flag."""
    args = build_parser(environ).parse_args(argv)
    if not args.model_dir:
        raise ConfigError("no model: Vertex AI sets AIP_STORAGE_URI from the Model's artifactUri; elsewhere pass --model-dir")
    try:
        port = int(args.port)
    except ValueError:
        raise ConfigError(f"the port (--port, or AIP_HTTP_PORT) is {args.port!r}, not a number") from None
    if not 0 < port < 65536:
        raise ConfigError(f"port {port} is outside 1-65535")
    for name, route in (("health", args.health_route), ("predict", args.predict_route)):
        if not route.startswith("/"):
            raise ConfigError(f"the {name} route {route!r} must start with /")
    if args.health_route == args.predict_route:
        raise ConfigError(f"the health and predict routes are both {args.health_route!r}")
    return Settings(args.model_dir, args.signature, args.host, port, args.health_route, args.predict_route, args.max_request_bytes,
                    args.max_instances, args.max_image_pixels, args.client_timeout, args.max_connections, args.max_batch,
                    args.access_log)


# --- the application ------------------------------------------------------------------------------

class _State:
    """What the routes share: the predictor once loaded."""

    def __init__(self):
        self.predictor = None
        self.requests = 0


def build_app(settings: Settings, state: _State):
    """The ASGI application: the health and predict routes. Pure of any model: `state.predictor`
    is set once one is loaded."""
    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from serving import answers, predictor as predictor_lib

    limits = instances.Limits(settings.max_instances, settings.max_image_pixels)

    def error(status: int, message: str) -> Response:
        # A body the server did not read leaves the connection mid-request: it is closed.
        headers = {"Connection": "close"} if status in (408, 413) else None
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    def ready() -> bool:
        return state.predictor is not None and state.predictor.alive()

    async def health(request) -> Response:
        if ready():
            return JSONResponse({})
        return error(503, "the model is loading")

    async def body_of(request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > settings.max_request_bytes:
            raise instances.BadRequest(f"request body is {int(declared):,} bytes; this server reads at most "
                                       f"{settings.max_request_bytes:,} (--max-request-bytes)", 413)
        chunks, size = [], 0
        try:
            async with asyncio.timeout(settings.client_timeout):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > settings.max_request_bytes:
                        raise instances.BadRequest(f"request body is over {settings.max_request_bytes:,} bytes, the most "
                                                   "this server reads (--max-request-bytes)", 413)
                    chunks.append(chunk)
        except TimeoutError:
            raise instances.BadRequest(f"request body not received in full within {settings.client_timeout:g} s "
                                       "(--client-timeout)", 408) from None
        return b"".join(chunks)

    async def predictions_for(read: list[instances.Instance]) -> list:
        predictor = state.predictor
        starts = range(0, len(read), predictor.max_batch)
        futures = [predictor.submit(read[start:start + predictor.max_batch]) for start in starts]
        predictions = []
        try:
            for start, future in zip(starts, futures):
                try:
                    predictions += await asyncio.wrap_future(future)
                except predictor_lib.RefusedInstance as refused:
                    raise instances.BadRequest(f"instances[{start + refused.index}]: the model refused it: "
                                               f"{refused.reason}") from None
        finally:
            for future in futures:
                future.cancel()  # a no-op for those answered; the rest are not worth computing
        return predictions

    async def predict(request) -> Response:
        from starlette.concurrency import run_in_threadpool

        if not ready():
            return error(503, f"the model is loading; {settings.health_route} answers 200 once it is ready")
        state.requests += 1
        try:
            body = await body_of(request)
            model = state.predictor.model
            # Big bodies: read off the event loop.
            read = await run_in_threadpool(instances.parse, body, model.inputs, limits, model.name)
            return Response(answers.body(await predictions_for(read)), media_type="application/json")
        except instances.BadRequest as bad:
            return error(bad.status, str(bad))
        except ClientDisconnect:
            return Response(status_code=400)  # nobody is there to read it
        except Exception as unexpected:  # noqa: BLE001  (a server bug: logged here, one line to the client)
            log.error("answering a request failed: %s: %s", type(unexpected).__name__, unexpected, exc_info=True)
            return error(500, f"internal error ({type(unexpected).__name__}); the server's log has the details")

    return Starlette(routes=[Route(settings.health_route, health, methods=["GET"]),
                             Route(settings.predict_route, predict, methods=["POST"])])


class _LingeringClose:
    """The connection's transport, closed as careful HTTP servers close one (a "lingering close"):
    when the server ends a connection whose client may still be sending (a body refused by its
    length, a request that took too long), it first shuts down its own side, so that its answer
    is sent whole, then reads and drops what the client still sends, for up to `seconds` or
    `budget` bytes, and only then closes. Closing at once, with the client's bytes unread, makes
    the kernel reset the connection, and the client can lose the answer it was about to read.
    Everything else is the transport's own."""

    def __init__(self, transport, loop, seconds: float, budget: int):
        self._transport, self._loop = transport, loop
        self._seconds, self._budget = seconds, budget
        self._timer = None
        self.lingering = False

    def __getattr__(self, name):
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        if self.lingering or self._transport.is_closing():
            return
        if not self._transport.can_write_eof():
            self._transport.close()
            return
        try:
            self._transport.write_eof()  # after what is buffered: the answer goes out whole
        except OSError:
            # The client reset or half-closed the connection first (ENOTCONN, EPIPE): there is no
            # one left to send the answer to, nor bytes of theirs to drain.
            self._transport.close()
            return
        self.lingering = True
        self._transport.resume_reading()
        self._timer = self._loop.call_later(self._seconds, self.abort_lingering)

    def drop(self, size: int) -> None:
        self._budget -= size
        if self._budget < 0:
            self.abort_lingering()

    def abort_lingering(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._transport.close()


def _protocol(max_request_bytes: int):
    """uvicorn's HTTP/1.1 protocol (h11), with what it lacks for a server facing any client:
    - a deadline for the request head: a connection must deliver a whole one within the keep-alive
      timeout (--client-timeout) of opening, or of its last response (uvicorn closes a connection
      that stays silent after a response, but waits forever for a first request, and for a head
      sent a byte at a time);
    - a lingering close (_LingeringClose)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        _deadline = None

        def connection_made(self, transport):
            super().connection_made(_LingeringClose(transport, self.loop, self.timeout_keep_alive, max_request_bytes))
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self.transport.lingering:
                self.transport.drop(len(data))
                return
            super().data_received(data)

        def eof_received(self):
            if self.transport.lingering:  # the client has sent all it will: done
                self.transport.abort_lingering()
            return super().eof_received()

        def on_response_complete(self):
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc):
            if self._deadline is not None:
                self._deadline.cancel()
            if self.transport.lingering:
                self.transport.abort_lingering()
            super().connection_lost(exc)

        def _arm(self):
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(self.timeout_keep_alive, self._expire)

        def _expire(self):
            if self.cycle is None or self.cycle.response_complete:  # still no request head: nothing to answer
                self.transport.abort_lingering()

    return Protocol


# uvicorn's warnings about what a client sent: the client's problem, not the server's, so not ERROR lines.
_CLIENT_CAUSED = ("Invalid HTTP request received.", "Exceeded concurrency limit.", "Unsupported upgrade request.")


class _ClientCausedToInfo(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() in _CLIENT_CAUSED or record.getMessage().startswith("No supported WebSocket library"):
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def configure_logging(access_log: bool) -> None:
    """`HH:MM:SS serving: ...` lines: INFO to stdout, WARNING and above to stderr, which Cloud
    Logging shows as ERROR (GoogleCloudPlatform/vertex-ai-samples#242)."""
    progress, problems = logging.StreamHandler(sys.stdout), logging.StreamHandler(sys.stderr)
    progress.addFilter(lambda record: record.levelno < logging.WARNING)
    problems.setLevel(logging.WARNING)
    formatter = logging.Formatter("%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for handler in (progress, problems):
        handler.setFormatter(formatter)
    logging.basicConfig(level=logging.INFO, handlers=[progress, problems])
    for noisy in ("tensorflow", "absl"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("uvicorn").setLevel(logging.WARNING)  # its start and stop lines: this module says its own
    logging.getLogger("uvicorn.error").addFilter(_ClientCausedToInfo())
    logging.getLogger("uvicorn.access").setLevel(logging.INFO if access_log else logging.WARNING)


def serve(settings: Settings) -> int:
    """Runs until SIGTERM or SIGINT (exit 0), or until the model cannot be loaded (exit 1)."""
    import uvicorn

    from serving import predictor as predictor_lib

    state = _State()
    config = uvicorn.Config(
        build_app(settings, state), host=settings.host, port=settings.port, log_config=None, lifespan="off",
        access_log=settings.access_log, http=_protocol(settings.max_request_bytes), timeout_keep_alive=settings.client_timeout,
        limit_concurrency=settings.max_connections, timeout_graceful_shutdown=GRACE_SECONDS, server_header=False)
    server = uvicorn.Server(config)
    failure: list[str] = []

    def load() -> None:
        started = time.monotonic()
        try:
            state.predictor, warmed = predictor_lib.load(settings.model_dir, settings.signature, settings.max_batch)
        except model_lib.ModelError as error:
            failure.append(str(error))
        except Exception as error:  # noqa: BLE001  (whatever stops the load ends the server, in one line)
            failure.append(f"{settings.model_dir}: cannot load the model ({type(error).__name__}: {error})".splitlines()[0])
        else:
            model = state.predictor.model
            log.info("model loaded from %s in %.1fs: %s; ready on %s%s", settings.model_dir,
                     time.monotonic() - started, model.describe(),
                     settings.predict_route, "" if warmed else " (not warmed up: the first request makes the model's first call)")
            return
        server.should_exit = True

    log.info("listening on %s:%d (health %s, predict %s); loading %s", settings.host, settings.port,
             settings.health_route, settings.predict_route, settings.model_dir)
    threading.Thread(target=load, name="model-loader", daemon=True).start()
    # uvicorn handles SIGTERM and SIGINT itself, then raises the signal again once it has shut down,
    # to end the process as the signal would: ignored here, so that a clean stop exits 0.
    stops: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, _frame: stops.append(number))
    try:
        server.run()  # a port it cannot listen on: uvicorn logs one line and exits 3
    finally:
        if state.predictor is not None:
            state.predictor.close()
    if failure:
        print(f"python -m serving.server: error: {failure[0]}", file=sys.stderr)
        return 1
    reason = signal.Signals(stops[0]).name if stops else "a stop"
    log.info("stopped on %s after %d prediction requests", reason, state.requests)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m serving.server`: serves until stopped; returns the exit code (serve says which)."""
    try:
        settings = settings_from(argv)
    except ConfigError as error:
        print(f"python -m serving.server: error: {error}", file=sys.stderr)
        return 2
    configure_logging(settings.access_log)
    return serve(settings)


if __name__ == "__main__":
    sys.exit(main())
