"""The release credential: what travels on /tether/estop_release proves the operator's token without
carrying it, works for one node, once, while fresh; the node's tokens file keeps only a hash."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.common.errors import CommandError
from bridge.ros2.edge import main as edge_main
from bridge.ros2.release_auth import (
    TOKEN_ENV,
    ReleaseAuthority,
    ReleaseError,
    ReleaseSigner,
    add_operator,
    make_release,
    read_token,
    revoke_operator,
)

ROOT = Path(__file__).resolve().parents[2]
FAST = 1 << 10          # scrypt n for these tests (the real 2**14 only where a test goes through the CLI)


class WallClock:
    """A settable wall clock in ns."""

    def __init__(self, t_ns: int = 1_800_000_000 * 10**9):
        self.t_ns = t_ns

    def __call__(self) -> int:
        return self.t_ns


@pytest.fixture
def setup(tmp_path):
    path = tmp_path / "robot" / "release_tokens.json"
    token = add_operator(path, "ada", scrypt_n=FAST)
    clock = WallClock()
    return path, token, clock, ReleaseAuthority.load(path, clock=clock)


def sign(token, clock, *, operator="ada", node="arm_1", why="cell clear", dt_s=0.0):
    return make_release(operator, token, node=node, why=why, t_ns=clock.t_ns + int(dt_s * 1e9), scrypt_n=FAST)


def test_a_signed_release_verifies_once_and_the_file_keeps_no_token(setup):
    path, token, clock, authority = setup
    assert token.startswith("ada.") and len(token) > 40
    text = sign(token, clock)
    assert token not in text and token.split(".", 1)[1] not in text
    assert authority.verify(text, node="arm_1") == ("ada", "cell clear")
    with pytest.raises(ReleaseError, match="^replayed: ") as exc:
        authority.verify(text, node="arm_1")
    assert exc.value.code == "replayed"
    raw = path.read_text()
    assert token.split(".", 1)[1] not in raw and json.loads(raw)["operators"]["ada"]["key"]
    assert path.stat().st_mode & 0o777 == 0o600
    signer = ReleaseSigner("ada", token, scrypt_n=FAST)         # a resend is signed anew: accepted too
    clock.t_ns += 10**6
    assert authority.verify(signer.sign(node="arm_1", t_ns=clock.t_ns), node="arm_1") == ("ada", "")
    assert authority.verify(signer.sign(node="arm_1", t_ns=clock.t_ns + 1), node="arm_1") == ("ada", "")


def test_refusals_name_why(setup, tmp_path):
    path, token, clock, authority = setup
    other = add_operator(tmp_path / "other.json", "ada", scrypt_n=FAST)   # a token of another robot's file
    good = sign(token, clock)
    operator, node, t_ns, why, mac = good.split("|")
    cases = [
        (sign(token, clock, node="arm_2"), "wrong node"),
        (sign(other, clock), "bad mac"),
        ("|".join((operator, node, t_ns, "something else", mac)), "bad mac"),             # altered why
        ("|".join((operator, node, str(int(t_ns) + 1), why, mac)), "bad mac"),            # altered time
        (sign(token, clock, dt_s=-31), "stale"),
        (sign(token, clock, dt_s=+31), "stale"),                                           # clock skew bound too
        ("ada: cell clear", "malformed"),                                                  # the old, bare-name form
        ("ada", "malformed"),
        ("ada|arm_1|soon|why|" + "0" * 64, "malformed"),
        ("x" * 2000, "malformed"),
        (None, "malformed"),
    ]
    bob = add_operator(tmp_path / "bob.json", "bob", scrypt_n=FAST)
    cases.append((make_release("bob", bob, node="arm_1", t_ns=clock.t_ns, scrypt_n=FAST), "unknown operator"))
    for text, code in cases:
        with pytest.raises(ReleaseError) as exc:
            authority.verify(text, node="arm_1")
        assert exc.value.code == code, (text, str(exc.value))
        assert str(exc.value).startswith(f"{code}: ")
    assert authority.verify(good, node="arm_1") == ("ada", "cell clear")  # none of those spent the good one


def test_a_release_signed_before_the_node_loaded_its_tokens_is_refused(setup):
    """A message captured before a node restart (within the freshness window) does not work after it."""
    path, token, clock, _ = setup
    captured = sign(token, clock)
    clock.t_ns += 5 * 10**9                                        # the node restarts 5 s later
    restarted = ReleaseAuthority.load(path, clock=clock)
    with pytest.raises(ReleaseError, match="^stale: .*before this node loaded"):
        restarted.verify(captured, node="arm_1")
    assert restarted.verify(sign(token, clock), node="arm_1")[0] == "ada"


def test_no_tokens_file_refuses_every_release_and_says_how_to_configure(setup):
    _, token, clock, _ = setup
    with pytest.raises(ReleaseError, match=r"^not configured: .*tether edge token add NAME --tokens FILE.*"
                                           r"--release-tokens FILE"):
        ReleaseAuthority.load(None).verify(sign(token, clock), node="arm_1")


def test_token_edits_reach_a_running_authority(setup):
    path, token, clock, authority = setup
    with pytest.raises(ReleaseError, match="^exists: 'ada' has a release token"):
        add_operator(path, "ada", scrypt_n=FAST)
    new = add_operator(path, "ada", replace=True, scrypt_n=FAST)
    with pytest.raises(ReleaseError, match="^bad mac"):
        authority.verify(sign(token, clock), node="arm_1")        # the replaced token stops working
    assert authority.verify(sign(new, clock), node="arm_1")[0] == "ada"
    revoke_operator(path, "ada")
    with pytest.raises(ReleaseError, match="^unknown operator"):
        authority.verify(sign(new, clock, why="again"), node="arm_1")
    with pytest.raises(ReleaseError, match="^unknown operator"):
        revoke_operator(path, "ada")
    assert authority.operators == []


@pytest.mark.parametrize(("content", "problem"), [
    (b"{", "cannot read"), (b'{"format": "tether-tokens/1", "tokens": {}}', "not a tether-release-tokens/1"),
    (b'{"format": "tether-release-tokens/1", "operators": {"ada": {"key": "zz"}}}', "operator 'ada': malformed"),
    (b'{"format": "tether-release-tokens/1", "operators": {"a b": {"key": "00"}}}', "operator 'a b': malformed"),
])
def test_a_bad_tokens_file_is_refused_naming_it(tmp_path, content, problem):
    path = tmp_path / "release_tokens.json"
    path.write_bytes(content)
    with pytest.raises(ReleaseError, match="^bad tokens file: ") as exc:
        ReleaseAuthority.load(path)
    assert str(path) in str(exc.value) and problem in str(exc.value)
    with pytest.raises(ReleaseError, match="^bad tokens file: "):
        add_operator(path, "ada", scrypt_n=FAST)                 # never overwrites a file it cannot read
    assert path.read_bytes() == content
    with pytest.raises(ReleaseError, match="^no tokens file: .* does not exist"):
        ReleaseAuthority.load(tmp_path / "missing.json")


def test_a_tokens_file_broken_while_running_refuses_releases(setup):
    path, token, clock, authority = setup
    path.write_text("garbage")
    with pytest.raises(ReleaseError, match="^bad tokens file: "):
        authority.verify(sign(token, clock), node="arm_1")


def test_signing_input_is_checked_before_anything_is_sent(setup):
    _, token, _, _ = setup
    for kwargs, match in [(dict(operator="bob"), "token: this token is for 'ada', not 'bob'"),
                          (dict(operator="a:b"), "token name must be"), (dict(token=""), "token: expected"),
                          (dict(node="a|b"), "node: expected"), (dict(node=" "), "node: expected"),
                          (dict(why="x" * 201), "why: expected at most 200"), (dict(why="a\nb"), "why: expected")]:
        args = dict(operator="ada", token=token, node="arm_1", why="ok") | kwargs
        with pytest.raises(ValueError, match=match):
            make_release(args.pop("operator"), args.pop("token"), scrypt_n=FAST, **args)


def test_read_token_from_flag_file_or_environment(tmp_path):
    f = tmp_path / "ada.token"
    f.write_text("ada.secret-from-file\n")
    assert read_token(token=" ada.flag ", token_file=f, env={TOKEN_ENV: "ada.env"}) == "ada.flag"
    assert read_token(token_file=f, env={TOKEN_ENV: "ada.env"}) == "ada.secret-from-file"
    assert read_token(env={TOKEN_ENV: "ada.env"}) == "ada.env"
    with pytest.raises(ValueError, match=f"--token, --token-file or \\${TOKEN_ENV}"):
        read_token(env={})
    with pytest.raises(ValueError, match="--token-file: cannot read"):
        read_token(token_file=tmp_path / "nope")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="--token-file: .* is empty"):
        read_token(token_file=tmp_path / "empty")


def test_cli_token_add_list_revoke(tmp_path, capsys):
    path = tmp_path / "release_tokens.json"
    edge_main(["token", "add", "ada", "--tokens", str(path)])
    token = capsys.readouterr().out.strip().splitlines()[-1]
    assert token.startswith("ada.")
    clock = WallClock()
    text = make_release("ada", token, node="tether_edge", t_ns=clock.t_ns)   # the real scrypt parameters
    assert ReleaseAuthority.load(path, clock=clock).verify(text, node="tether_edge") == ("ada", "")
    edge_main(["token", "add", "bob", "--tokens", str(path)])
    capsys.readouterr()
    edge_main(["token", "list", "--tokens", str(path)])
    assert capsys.readouterr().out.split() == ["ada", "bob"]
    with pytest.raises(CommandError, match="exists: 'ada'"):
        edge_main(["token", "add", "ada", "--tokens", str(path)])
    edge_main(["token", "revoke", "bob", "--tokens", str(path)])
    with pytest.raises(CommandError, match="unknown operator: 'bob'"):
        edge_main(["token", "revoke", "bob", "--tokens", str(path)])
    with pytest.raises(SystemExit) as exc:
        edge_main(["token", "add", "--tokens", str(path)])
    assert exc.value.code == 2 and "add: NAME is required" in capsys.readouterr().err


def test_concurrent_token_adds_from_separate_processes_all_land(tmp_path):
    """Four `tether edge token add` processes at once on one file: the file lock serialises the
    read-modify-write, so no add is lost."""
    path = tmp_path / "release_tokens.json"
    names = ["op0", "op1", "op2", "op3"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-m", "tether", "edge", "token", "add", name, "--tokens", str(path)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in names]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outs
    assert ReleaseAuthority.load(path).operators == names
    assert sorted(f.name for f in tmp_path.iterdir()) == [".release_tokens.json.lock", "release_tokens.json"]
