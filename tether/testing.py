"""pytest plugin: the real Tether stack (tritonserver + a `tether gateway` process) as fixtures, sims
connected to it, policy files imported into it, and markers that skip where a component is absent.

Load it with `pytest -p tether.testing`, or nothing at all: installing tether registers it (entry
point `pytest11`). Loaded, it only adds fixtures, markers and options, and makes SIGTERM end the run
as Ctrl-C does (every fixture torn down): nothing starts until a test asks for `tether_stack`. A
sample project (plain text: it starts processes):

    # conftest.py
    import pytest

    @pytest.fixture(scope="session")
    def tether_stack_options():                  # or ini: tether_envs = InvertedPendulum-v5
        return {"envs": ["InvertedPendulum-v5"]}

    # test_policy.py
    def test_the_policy_balances(tether_sim):
        result = tether_sim("InvertedPendulum-v5", episodes=8, envs=4, seed=0)
        assert result.episodes == 8 and not result.errors
        assert result.mean_return > 5

    def test_my_file(tether_stack, tether_sim):  # `pytest --tether-policy walker.onnx` gives tether_policy
        version = tether_stack.import_policy("walker.onnx", name="walker")
        assert tether_sim("Walker2d-v5", policy="walker", episodes=2).policy_versions == {version: ...}

    @pytest.mark.requires_gpu
    @pytest.mark.requires_newton
    def test_on_newton(tether_sim): ...

Fixtures:
- `tether_stack`: a started `tether.stack.Stack` in a temporary folder, one per session (ini
  `tether_stack_scope = module` for one per module, or package). Stopped at the end of its scope,
  failed tests or not, and on SIGTERM (e.g. a cancelled CI job). A test that fails while using it
  gets the end of the gateway's log in its report. Skipped, naming the binary, where tritonserver
  is missing (ini `tether_missing = fail` to fail instead).
- `tether_stack_options`: the Stack's keywords (envs, models, policy, secure, deadline_ms,
  gateway_args, seed, stochastic); from the ini options `tether_envs`, `tether_secure`,
  `tether_gateway_args` unless a conftest overrides the fixture (at the stack's scope). The gateway's
  per-step deadline is 2 s (ini `tether_deadline_ms`) unless they give `deadline_ms`: a test asserts
  behaviour, a loaded CI runner stalls, and the gateway's own 100 ms is a robot's.
- `tether_sim`: `tether_sim(env, *, episodes=|steps=|seconds=, envs=1, seed=0, policy=None,
  num_envs=8)` runs sims through the stack's gateway (sim.client, the same path as `tether sim`)
  and returns a `SimResult` (returns per episode, mean return, steps, errors, round trips).
- `tether_policy`: the file given with `--tether-policy FILE` (ini `tether_policy`), imported into
  the stack as `--tether-policy-name` (default: the file's stem) through `tether policy import`'s
  path; an `ImportedPolicy(name, version, path)`. Skipped when no file is given.

Markers: `requires_triton`, `requires_mujoco`, `requires_newton`, `requires_onnxruntime`,
`requires_gpu`, `requires_binary("nats-server", ...)`: each skips with the reason naming what is absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bridge.common.processes import sigterm_interrupts

__all__ = ["ImportedPolicy", "SimResult", "absent", "run_sims"]

SCOPES = ("session", "package", "module")
MARKERS = {
    "requires_triton": "skip unless the tritonserver binary (nvidia-pytriton) is installed",
    "requires_mujoco": "skip unless MuJoCo and gymnasium's MuJoCo envs import",
    "requires_newton": "skip unless NVIDIA Newton and Warp import",
    "requires_onnxruntime": "skip unless onnxruntime imports",
    "requires_gpu": "skip unless a CUDA GPU is visible to torch",
    "requires_binary(*names)": "skip unless every named executable is on PATH",
}


# -- what is absent ---------------------------------------------------------------------------------------

def _missing_modules(*names: str) -> list[str]:
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def _triton_absent() -> str | None:
    try:
        from inference_server.server import TritonStartError, triton_binary
    except ImportError as exc:
        return f"the gateway extra is not installed (tether[gateway]): {exc}"
    try:
        triton_binary()
    except TritonStartError as exc:
        return str(exc)
    return None


def _gpu_absent() -> str | None:
    try:
        import torch
    except ImportError:
        return "no GPU: torch is not installed"
    return None if torch.cuda.is_available() else "no CUDA GPU visible to torch (torch.cuda.is_available() is False)"


def absent(marker: str, *args: str) -> str | None:
    """Why the component a `requires_*` marker names is absent, or None when it is there.

    >>> absent("requires_binary", "sh") is None
    True
    >>> absent("requires_binary", "sh", "no-such-binary-here")
    'executable not on PATH: no-such-binary-here'
    """
    if marker == "requires_triton":
        return _triton_absent()
    if marker == "requires_gpu":
        return _gpu_absent()
    if marker == "requires_binary":
        missing = [name for name in args if shutil.which(name) is None]
        return f"executable not on PATH: {', '.join(missing)}" if missing else None
    modules = {"requires_mujoco": ("mujoco", "gymnasium"), "requires_newton": ("newton", "warp"),
               "requires_onnxruntime": ("onnxruntime",)}
    if marker not in modules:
        raise ValueError(f"unknown marker {marker!r}: one of {', '.join(m.split('(')[0] for m in MARKERS)}")
    missing = _missing_modules(*modules[marker])
    return f"module not installed: {', '.join(missing)}" if missing else None


# -- results ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SimResult:
    """What sims of one env did through the stack: client-side figures (`bridge.client.ClientStats`)."""

    env: str
    policy: str
    returns: tuple[float, ...]            # one per finished episode, in the order they ended
    steps: int
    errors: dict[str, int]                # StepError codes (and INVALID_ACTION) by name
    policy_versions: dict[int, int]       # version -> env steps it acted in
    rtt_ms: dict[str, float | None]       # p50, p99, ...
    summary: dict = field(repr=False)     # ClientStats.summary()

    @property
    def episodes(self) -> int:
        return len(self.returns)

    @property
    def mean_return(self) -> float | None:
        return sum(self.returns) / len(self.returns) if self.returns else None


@dataclass(frozen=True)
class ImportedPolicy:
    name: str
    version: int
    path: Path


async def run_sims(stack, env: str, *, episodes: int | None = None, steps: int | None = None,
                   seconds: float | None = None, envs: int = 1, seed: int = 0, policy: str | None = None,
                   num_envs: int = 8, connect_timeout: float = 60.0, reply_timeout: float = 30.0) -> SimResult:
    """`envs` sessions of `env` against `stack`'s gateway (single-env sessions seeded seed, seed+1, ...;
    a vector env id such as `newton:cartpole` gives `envs` vectorised sessions of `num_envs` worlds, with a
    `steps` or `seconds` budget). `policy`: default the stack's policy for `env` (when the stack made one),
    else the gateway's default."""
    import sim
    from sim.client import run_sessions
    from tether.initial_policy import policy_name

    if policy is None:
        policy = policy_name(env) if env in getattr(stack, "envs", ()) else ""
    if sim.is_vector(env):
        def make(i: int):
            return sim.make(env, num_envs=num_envs, seed=seed + i * num_envs)
    else:
        def make(i: int):
            return sim.make(env, seed=seed + i)
    stats = await run_sessions(stack.gateway, make, envs=envs, episodes=episodes, steps=steps, seconds=seconds,
                               policy=policy, connect_timeout=connect_timeout, reply_timeout=reply_timeout,
                               **stack.sim_kwargs())
    return SimResult(env=env, policy=policy, returns=tuple(stats.returns), steps=stats.steps,
                     errors=dict(stats.errors), policy_versions=dict(stats.policy_versions), rtt_ms=stats.rtt_ms(),
                     summary=stats.summary())


# -- pytest hooks ---------------------------------------------------------------------------------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tether", "Tether's real stack (tether.testing)")
    group.addoption("--tether-policy", metavar="FILE", help="a TorchScript or ONNX file the tether_policy fixture "
                    "imports into the stack (default: ini tether_policy)")
    group.addoption("--tether-policy-name", metavar="NAME", help="the name it is imported as (default: its stem)")
    parser.addini("tether_stack_scope", "scope of tether_stack: session (default), package or module",
                  default="session")
    parser.addini("tether_envs", "envs tether_stack serves a freshly initialised policy for", type="linelist",
                  default=[])
    parser.addini("tether_secure", "tether_stack serves over TLS and checks tokens", type="bool", default=False)
    parser.addini("tether_gateway_args", "more `tether gateway` flags for tether_stack", type="args", default=[])
    parser.addini("tether_deadline_ms", "tether_stack's per-step inference deadline, unless tether_stack_options "
                  "gives deadline_ms (default 2000: a loaded CI runner stalls; the gateway's own is 100)",
                  default="2000")
    parser.addini("tether_policy", "a policy file for the tether_policy fixture (--tether-policy)", default="")
    parser.addini("tether_missing", "skip (default) or fail a test whose tether_stack cannot start for lack of "
                  "tritonserver", default="skip")


def pytest_configure(config: pytest.Config) -> None:
    for marker, text in MARKERS.items():
        config.addinivalue_line("markers", f"{marker}: {text}")
    # SIGTERM (a cancelled CI job, `timeout`) ends the run as Ctrl-C does: pytest then tears every fixture down,
    # the stack's and a conftest's own servers alike (where SIGTERM still has its default action)
    guard = contextlib.ExitStack()
    guard.enter_context(sigterm_interrupts())
    config.add_cleanup(guard.close)


@pytest.hookimpl(tryfirst=True)  # before fixtures: a skipped test never starts a stack
def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in item.iter_markers():
        if marker.name in _MARKER_NAMES:
            reason = absent(marker.name, *marker.args)
            if reason is not None:
                _skip_at_the_test(f"{marker.name}: {reason}")


def _skip_at_the_test(reason: str) -> None:
    """Skip, reported at the test's line (as pytest's own skip marker is), not at this plugin's."""
    try:
        exc = pytest.skip.Exception(reason, _use_item_location=True)
    except TypeError:  # a pytest without the keyword
        pytest.skip(reason)
    raise exc


_MARKER_NAMES = frozenset(m.split("(")[0] for m in MARKERS)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    stack = getattr(item, "funcargs", {}).get("tether_stack")
    if report.failed and stack is not None and report.when == "call":
        log = Path(stack.directory) / "gateway.log"
        if log.exists():
            tail = log.read_text(errors="replace").splitlines()[-40:]
            report.sections.append((f"tether gateway log (end of {log})", "\n".join(tail)))
    return report


def _stack_scope(fixture_name: str, config: pytest.Config) -> str:
    scope = config.getini("tether_stack_scope") or "session"
    if scope not in SCOPES:
        raise pytest.UsageError(f"ini tether_stack_scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    return scope


@pytest.fixture(scope=_stack_scope)
def tether_stack_options(pytestconfig: pytest.Config) -> dict:
    """The keywords of tether_stack's `Stack`; override this fixture in a conftest to choose them."""
    return {"envs": list(pytestconfig.getini("tether_envs")), "secure": pytestconfig.getini("tether_secure"),
            "gateway_args": list(pytestconfig.getini("tether_gateway_args"))}


@pytest.fixture(scope=_stack_scope)
def tether_stack(tether_stack_options: dict, tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config):
    """A started tether.stack.Stack; stopped at the end of its scope (and on SIGTERM)."""
    from tether.stack import Stack

    reason = _triton_absent()
    if reason is not None:
        if pytestconfig.getini("tether_missing") == "fail":
            pytest.fail(f"tether_stack: {reason}")
        pytest.skip(f"tether_stack: {reason}")
    options = {"deadline_ms": int(pytestconfig.getini("tether_deadline_ms")), **tether_stack_options}
    stack = Stack(tmp_path_factory.mktemp("tether-stack"), **options)
    try:
        yield stack.start()
    finally:
        stack.close()


@pytest.fixture
def tether_sim(tether_stack) -> Callable[..., SimResult]:
    """`tether_sim(env, episodes=8, envs=4, seed=0)` -> SimResult, through tether_stack's gateway.
    From a coroutine: `await tether_sim.run(env, ...)`."""
    return _SimRunner(tether_stack)


class _SimRunner:
    def __init__(self, stack):
        self.stack = stack

    def __call__(self, env: str, **kw) -> SimResult:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(run_sims(self.stack, env, **kw))
        raise RuntimeError("tether_sim(...) called inside a running event loop: use `await tether_sim.run(...)`")

    async def run(self, env: str, **kw) -> SimResult:
        return await run_sims(self.stack, env, **kw)


@pytest.fixture(scope=_stack_scope)
def tether_policy(tether_stack, pytestconfig: pytest.Config) -> ImportedPolicy:
    """The policy file given with --tether-policy (or ini tether_policy), imported into tether_stack."""
    given = pytestconfig.getoption("tether_policy") or pytestconfig.getini("tether_policy")
    if not given:
        pytest.skip("tether_policy: no policy file given (pytest --tether-policy FILE, or ini tether_policy)")
    path = Path(given)
    if not path.is_absolute() and not path.exists():
        path = Path(pytestconfig.rootpath) / path
    name = pytestconfig.getoption("tether_policy_name") or re.sub(r"[^a-z0-9]+", "_", path.stem.lower()).strip("_")
    return ImportedPolicy(name, tether_stack.import_policy(path, name=name), path)

