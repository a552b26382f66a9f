"""``evald config check`` refuses a webhook secret exactly as ``evald run`` does: one check, in the
config model, so neither can accept what the other refuses (issue 31)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from daemon.cli import main
from tests.harness import evald, write_config, write_dataset

NOT_BASE64 = (
    "the webhook secret is not base64: Standard Webhooks secrets are 'whsec_' followed by the base64 of "
    "the key (to use a passphrase, base64-encode it: printf %s PASSPHRASE | base64)"
)
GOOD = "whsec_" + base64.b64encode(b"k" * 32).decode()


def _config(tmp_path: Path, secret: str) -> Path:
    tmp_path.mkdir(exist_ok=True)
    path = write_config(
        tmp_path, f"sqlite:///{tmp_path / 'e.db'}", dataset=write_dataset(tmp_path / "arith.jsonl", 4)
    )
    with path.open("a") as extra:
        extra.write(f'[[webhooks]]\nname = "oncall"\nurl = "http://127.0.0.1:9/hook"\n{secret}\n')
    return path


def test_a_secret_that_is_not_base64_is_refused_by_check_and_run_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(tmp_path, 'secret_env = "HOOK_SECRET"')
    monkeypatch.setenv("HOOK_SECRET", "my passphrase!")
    expected = f"evald: {path}: webhooks[0]: environment variable HOOK_SECRET: {NOT_BASE64}"
    assert main(["config", "check", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [expected]
    assert "passphrase!" not in captured.err and captured.out == ""
    # The daemon itself, as systemd starts it: the same words, and it does not start.
    done = evald("--config", str(path), "run", env={"HOOK_SECRET": "my passphrase!"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [expected]


def test_a_bad_secret_file_is_refused_by_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = tmp_path / "hook.secret"
    secret.write_text("not base64 at all!\n")
    secret.chmod(0o600)
    path = _config(tmp_path, f'secret_file = "{secret}"')
    assert main(["config", "check", str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"evald: {path}: webhooks[0]: webhook secret file {secret}: {NOT_BASE64}"
    ]
    secret.write_text(GOOD + "\n")
    secret.chmod(0o644)
    assert main(["config", "check", str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"evald: {path}: webhooks[0]: webhook secret file {secret} is accessible by group or others "
        f"(mode 0644); make it private with: chmod 600 {secret}"
    ]
    secret.chmod(0o600)
    assert main(["config", "check", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"{path}: ok")


def test_a_good_secret_passes_and_an_absent_one_is_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(tmp_path, 'secret_env = "HOOK_SECRET"')
    monkeypatch.setenv("HOOK_SECRET", GOOD)
    assert main(["config", "check", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(f"{path}: ok") and captured.err == ""
    # Checked on a host where only the daemon's unit sets the variable: not an error, but said.
    unsigned = _config(tmp_path / "unsigned", "")  # a Slack hook checks no signature: none is needed
    assert main(["config", "check", str(unsigned)]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.delenv("HOOK_SECRET")
    assert main(["config", "check", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(f"{path}: ok")
    assert captured.err.strip().splitlines() == [
        "evald: warning: webhooks[0] (oncall): environment variable HOOK_SECRET is not set here, so its "
        "secret was not checked; evald run refuses to start without it"
    ]
