"""Async policy inference against Triton over gRPC, addressed by model name and explicit version.

Usage (plain text: it needs a running Triton):

    client = PolicyClient(server.grpc_url, timeout_s=1.0)
    await client.wait_ready(timeout=10)
    out = await client.infer("policy", 2, {"obs": obs_batch}, ["action"])   # {"action": array}
    await client.close()

A Triton started with a secret (`TritonServer(secret=...)`) answers only calls that carry it:
`PolicyClient(url, secret=read_secret(path))` sends it on every call (`inference_server.secret`).

Every failure, an unreachable server and a timeout included, is an `InferenceError` whose
message names the url, model and version, and whose `code` is the gRPC status name:

    >>> import asyncio, numpy as np
    >>> async def call():
    ...     client = PolicyClient("127.0.0.1:1", timeout_s=1.0)
    ...     try:
    ...         await client.infer("policy", 1, {"obs": np.zeros((1, 3), np.float32)}, ["action"])
    ...     except InferenceError as exc:
    ...         return exc.code, exc.model, exc.version
    ...     finally:
    ...         await client.close()
    >>> asyncio.run(call())
    ('UNAVAILABLE', 'policy', 1)
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Mapping, Sequence

import numpy as np
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException, np_to_triton_dtype, triton_to_np_dtype

from inference_server.secret import check_secret, grpc_headers
from inference_server.stream import InferStream, StreamError
from protos.codec import Spec


class InferenceError(RuntimeError):
    """An inference (or server query) that failed; `code` is the gRPC status name when known."""

    def __init__(self, message: str, *, url: str, model: str | None = None, version: int | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.url, self.model, self.version, self.code = url, model, version, code


@functools.cache
def _triton_dtype(dtype: np.dtype) -> str:
    return np_to_triton_dtype(dtype)


class PolicyClient:
    """Wraps `tritonclient.grpc.aio` for one Triton server; use from one event loop."""

    def __init__(self, url: str, *, timeout_s: float = 5.0, secret: str | None = None):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s {timeout_s!r} must be > 0")
        self.url = url
        self.timeout_s = timeout_s
        self._secret = check_secret(secret, where="PolicyClient(secret=...)") if secret is not None else None
        self._headers = grpc_headers(self._secret)  # Triton's restricted protocols (None: no header)
        self._client: triton_aio.InferenceServerClient | None = None
        self._stream: InferStream | None = None

    def _triton(self) -> triton_aio.InferenceServerClient:
        # created lazily, inside the event loop that will use it
        if self._client is None:
            self._client = triton_aio.InferenceServerClient(self.url)
        return self._client

    def _error(self, what: str, exc: BaseException, model: str | None = None,
               version: int | None = None) -> InferenceError:
        if isinstance(exc, InferenceServerException):
            code = (exc.status() or "").removeprefix("StatusCode.") or None
            detail = exc.message()
        elif isinstance(exc, asyncio.TimeoutError | TimeoutError):
            code, detail = "DEADLINE_EXCEEDED", f"no answer within {self.timeout_s} s"
        else:
            code, detail = None, f"{type(exc).__name__}: {exc}"
        target = f" model {model!r} version {version}" if model is not None else ""
        return InferenceError(f"{what} on {self.url}{target} failed ({code}): {detail}", url=self.url,
                              model=model, version=version, code=code)

    async def _ask(self, what: str, call, model: str | None = None, version: int | None = None):
        """`await call()` (a query of Triton's), any failure an InferenceError naming `what`."""
        try:
            return await call()
        except Exception as exc:
            raise self._error(what, exc, model, version) from exc

    async def infer(self, model: str, version: int, inputs: Mapping[str, np.ndarray],
                    outputs: Sequence[str], *, parameters: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
        """Run one batched request on `model` at exactly `version`; returns the named outputs. `parameters`:
        integer request parameters the model reads (inference_server.persistent: the policy version)."""
        request = service_pb2.ModelInferRequest(model_name=model, model_version=str(version))
        for key, value in (parameters or {}).items():
            request.parameters[key].int64_param = value
        try:
            for name, array in inputs.items():
                array = np.ascontiguousarray(array)
                request.inputs.add(name=name, datatype=_triton_dtype(array.dtype), shape=array.shape)
                request.raw_input_contents.append(array.tobytes())
        except Exception as exc:
            raise self._error("infer", exc, model, version) from exc
        for name in outputs:
            request.outputs.add(name=name)
        if self._stream is None:
            self._stream = InferStream(self.url, secret=self._secret)
        try:
            response = await self._stream.infer(request, timeout_s=self.timeout_s)
        except StreamError as exc:
            raise InferenceError(f"infer on {self.url} model {model!r} version {version} failed ({exc.code}): "
                                 f"{exc.detail}", url=self.url, model=model, version=version, code=exc.code) from exc
        arrays = {out.name: np.frombuffer(raw, triton_to_np_dtype(out.datatype)).reshape(out.shape)
                  for out, raw in zip(response.outputs, response.raw_output_contents, strict=True)}
        missing = [name for name in outputs if name not in arrays]
        if missing:
            raise InferenceError(f"infer on {self.url} model {model!r} version {version}: outputs {missing} "
                                 "missing from the response", url=self.url, model=model, version=version)
        return arrays

    async def wait_ready(self, timeout: float) -> None:
        """Poll until the server reports ready; `InferenceError` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while True:
            try:
                if await self._triton().is_server_ready(headers=self._headers,
                                                        client_timeout=min(self.timeout_s, 1.0)):
                    return
            except Exception as exc:
                last = exc
            if time.monotonic() >= deadline:
                detail = f": {last}" if last is not None else ""
                raise InferenceError(f"Triton on {self.url} not ready after {timeout} s{detail}",
                                     url=self.url, code="UNAVAILABLE")
            await asyncio.sleep(0.05)

    async def live(self) -> bool:
        """Whether the server answers its liveness check (it may be loading models: readiness, with Triton's strict
        readiness, is false while a model loads); False when it cannot be reached."""
        try:
            return bool(await self._triton().is_server_live(headers=self._headers,
                                                            client_timeout=min(self.timeout_s, 1.0)))
        except Exception:
            return False

    async def loaded_models(self) -> list[str]:
        """The names of the models with a version READY on the server, sorted."""
        index = await self._ask("repository index", lambda: self._triton().get_model_repository_index(
            headers=self._headers, client_timeout=self.timeout_s))
        return sorted({m.name for m in index.models if m.state == "READY"})

    async def server_version(self) -> str:
        """Triton's version string, e.g. "2.51.0"."""
        metadata = await self._ask("server metadata", lambda: self._triton().get_server_metadata(
            headers=self._headers, client_timeout=self.timeout_s))
        return metadata.version

    async def ready_versions(self, model: str) -> list[int]:
        """The versions of `model` Triton serves right now (state READY), ascending."""
        index = await self._ask("repository index", lambda: self._triton().get_model_repository_index(
            headers=self._headers, client_timeout=self.timeout_s), model)
        return sorted(int(m.version) for m in index.models
                      if m.name == model and m.state == "READY" and m.version.isdigit())

    async def load_model(self, model: str, *, timeout_s: float = 60.0) -> None:
        """(Re)load `model` from the repository: Triton loads new version folders and unloads the
        ones that are gone, while the unchanged versions keep serving."""
        await self._ask("load model", lambda: self._triton().load_model(
            model, headers=self._headers, client_timeout=timeout_s), model)

    async def unload_model(self, model: str, *, timeout_s: float = 60.0) -> None:
        """Unload every version of `model` (its stubs end)."""
        await self._ask("unload model", lambda: self._triton().unload_model(
            model, headers=self._headers, client_timeout=timeout_s), model)

    async def model_io(self, model: str, version: int) -> tuple[tuple[Spec, ...], tuple[Spec, ...]]:
        """The (inputs, outputs) tensor specs `model` `version` serves, without the batch dimension."""
        meta = await self._ask("model metadata", lambda: self._triton().get_model_metadata(
            model, str(version), headers=self._headers, client_timeout=self.timeout_s), model, version)

        def specs(tensors) -> tuple[Spec, ...]:
            return tuple(Spec(t.name, triton_to_np_dtype(t.datatype), tuple(t.shape)[1:]
                              if t.shape and t.shape[0] == -1 else tuple(t.shape)) for t in tensors)

        return specs(meta.inputs), specs(meta.outputs)

    async def close(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.close()
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()
