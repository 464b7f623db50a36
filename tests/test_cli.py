"""The `tether` command: failures read as messages, fast, with a non-zero exit; every command's flags are
documented, spelled one way per concept (old spellings warn), and listed in docs/cli.md."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.common.flags import CONCEPTS, deprecated_aliases
from tether.cli import COMMANDS
from tether.cli_reference import all_parsers, reference

ROOT = Path(__file__).resolve().parent.parent


def tether(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "tether", *args], capture_output=True, text=True, timeout=timeout)


def test_unknown_subcommand_prints_usage():
    run = tether("fly")
    assert run.returncode == 2 and "usage: tether {demo,triton,gateway,sim,edge,train,rollout," in run.stderr
    assert all(f",{command}" in run.stderr for command in ("status", "estop", "release", "certs", "token", "log"))


def test_gateway_without_triton_says_so(unused_port):
    run = tether("gateway", "--triton", f"127.0.0.1:{unused_port}", "--port", "0", "--triton-timeout", "1")
    assert run.returncode == 1
    assert f"Triton at 127.0.0.1:{unused_port} is not ready after 1 s" in run.stderr
    assert "Traceback" not in run.stderr


def test_triton_on_a_missing_repository_says_so(tmp_path):
    run = tether("triton", "--model-repository", str(tmp_path / "nope"), "--models", "x")
    assert run.returncode == 1 and "nope" in run.stderr and "Traceback" not in run.stderr


def test_an_old_spelling_still_works_and_warns_naming_the_new_one(tmp_path):
    run = tether("triton", "--repository", str(tmp_path / "nope"), "--models", "x")
    assert "tether triton: warning: --repository is deprecated, use --model-repository" in run.stderr
    assert run.returncode == 1 and "nope" in run.stderr  # it did what --model-repository does


def test_help_imports_no_command():
    """`tether --help` reads the table of commands only: no command's module (nor grpc, torch) is imported."""
    code = ("import sys\nfrom tether.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('bridge', 'sim', 'trainer', 'inference_server', 'grpc', 'torch')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.stdout.splitlines()[-1] == "[]", run.stdout[-2000:] + run.stderr[-2000:]
    assert all(f"    {name}" in run.stdout for name in COMMANDS)


def test_demo_trains_from_one_vectorised_session_unless_told():
    """The fast path is the default: `tether demo --train` learns from one session of 8 envs (`--envs 8
    --sessions 1`), not from 8 single-env sessions."""
    from tether.demo_cli import parser
    from tether.topology import DemoConfig

    a = parser().parse_args(["--train"])
    assert (a.envs, a.sessions) == (8, 1)
    assert DemoConfig(train=True, envs=a.envs, sessions=a.sessions).vector


def test_demo_rejects_bad_flags():
    run = tether("demo", "--envs", "0")
    assert run.returncode == 2 and "--envs must be at least 1, got 0" in run.stderr


PARSERS = list(all_parsers())


def _flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.help != argparse.SUPPRESS and not isinstance(a, argparse._SubParsersAction)]


def test_every_command_has_parsers_and_every_flag_and_argument_has_help():
    assert {name for name, _, _ in PARSERS} == set(COMMANDS)
    missing = [f"{prog} {a.option_strings or a.dest}" for _, prog, p in PARSERS for a in _flags(p) if not a.help]
    assert not missing, f"flags without help text: {missing}"


def test_no_two_commands_spell_one_concept_differently():
    current = {new for new, _ in CONCEPTS.values()}
    old = {o: new for new, olds in CONCEPTS.values() for o in olds}
    offending = [f"{prog}: {s} (say {old[s]})" for _, prog, p in PARSERS for a in _flags(p)
                 for s in a.option_strings if s in old and s not in current]
    assert not offending, offending
    used = {s for _, _, p in PARSERS for a in p._actions for s in a.option_strings}
    assert current <= used, f"concepts no parser uses (a stale table): {current - used}"
    # the one old spelling that is also a current one: the edge's --deadline-ms is only an alias of --watchdog-ms
    edge = next(p for _, prog, p in PARSERS if prog == "tether edge")
    assert deprecated_aliases(edge)["--deadline-ms"] == "--watchdog-ms"
    assert deprecated_aliases(next(p for _, prog, p in PARSERS if prog == "tether gateway")) == {}


def test_every_deprecated_alias_maps_to_a_flag_of_its_parser_and_is_in_the_table():
    old = {o: new for new, olds in CONCEPTS.values() for o in olds}
    aliases = [(prog, o, n, p) for _, prog, p in PARSERS for o, n in deprecated_aliases(p).items()]
    assert len(aliases) >= 8
    for prog, o, n, p in aliases:
        assert old.get(o) == n, f"{prog}: {o} -> {n} is not in bridge.common.flags.CONCEPTS"
        assert any(n in a.option_strings for a in _flags(p)), f"{prog}: {o} aliases {n}, which it lacks"


@pytest.mark.parametrize(("prog", "argv", "dest", "value"), [
    ("tether edge", ["--gateway", "h:1", "--deadline-ms", "300"], "watchdog_ms", 300.0),
    ("tether edge", ["--gateway", "h:1", "--status-s", "2"], "status_every", 2.0),
    ("tether edge", ["--gateway", "h:1", "--report", "r.json"], "summary", Path("r.json")),
    ("tether sim", ["--gateway", "h:1", "--labels", "robot=a,site=b"], "label", ["robot=a,site=b"]),
    ("tether rollout rollback", ["--why", "jerky"], "reason", "jerky"),
    ("tether rollout canary", ["--labels", "robot=a", "--why", "x"], "label", ["robot=a"]),
    ("tether policy import", ["f.onnx", "--name", "walker"], "policy", "walker"),
    ("tether triton", ["--repository", "m"], "model_repository", Path("m")),
    ("tether train", ["--algo", "bc", "--log-dir", "d"], "experience_dir", "d"),
])
def test_a_deprecated_alias_warns_and_sets_what_the_new_flag_sets(prog, argv, dest, value, capsys):
    parser = [p for _, pr, p in PARSERS if pr == prog][-1]  # tether train: the ranks' parser, after the launcher's
    args = parser.parse_args(argv)
    assert getattr(args, dest) == value
    assert f"{prog}: warning: {argv[-2]} is deprecated, use --" in capsys.readouterr().err


def test_a_required_flag_given_by_its_old_spelling_counts_and_missing_both_is_refused(capsys):
    parser = next(p for _, prog, p in PARSERS if prog == "tether rollout pin")
    assert parser.parse_args(["robot=a", "3", "--why", "hold"]).reason == "hold"
    with pytest.raises(SystemExit) as refused:
        parser.parse_args(["robot=a", "3"])
    assert refused.value.code == 2 and "required: --reason" in capsys.readouterr().err


def test_docs_cli_md_is_generated_from_the_parsers():
    assert (ROOT / "docs" / "cli.md").read_text() == reference(), \
        "docs/cli.md is stale: python -m tether.cli_reference > docs/cli.md"


def test_train_exits_non_zero_when_a_rank_fails(tmp_path):
    """A rank that fails (BC on a log with no segments) fails `tether train`: torchrun's code is its exit status."""
    (tmp_path / "log").mkdir()
    run = tether("train", "--algo", "bc", "--arch", "mlp", "--experience-dir", str(tmp_path / "log"), "--steps", "1",
                 "--nproc", "1", "--max-restarts", "0", timeout=300)
    assert run.returncode != 0, run.stderr[-2000:]
    assert "no *.mcap segments" in run.stderr
    assert json.loads(run.stdout.splitlines()[-1])["exit_code"] == run.returncode


@pytest.mark.parametrize("command", [
    ["status", "--timeout", "2"], ["estop", "--all", "--timeout", "2"], ["rollout", "list", "--timeout", "2"],
    ["sim", "--connect-timeout", "2", "--seconds", "1"],
])
def test_a_command_that_cannot_reach_its_gateway_exits_1_saying_why(command, unused_port):
    run = tether(*command, "--gateway", f"127.0.0.1:{unused_port}")
    assert run.returncode == 1, run.stderr
    assert f"127.0.0.1:{unused_port}" in run.stderr or "UNAVAILABLE" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("command", [["log", "inspect"], ["policy", "inspect"], ["certs", "client"]])
def test_a_command_given_a_missing_path_exits_1_naming_it(command, tmp_path):
    missing = str(tmp_path / "missing")
    run = tether(*command, missing, *(["x", "--role", "robot"] if command[0] == "certs" else []))
    assert run.returncode == 1 and missing in run.stderr and "Traceback" not in run.stderr
