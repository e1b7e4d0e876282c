"""`bpgw run` and the state commands as a new user meets them, run as real subprocesses:
bad URLs, a taken port, data folders (issue 8 items 1-4)."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_kit import bpgw, cli_env

from servers import free_port

READ_COMMANDS = (("show", "lotbot-1"), ("outbox",), ("identity", "show", "Lotbot"))


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def test_bad_redis_url_is_one_line_as_from_a_config_file(tmp_path: Path) -> None:
    config = tmp_path / "gw.toml"
    config.write_text('[state]\nredis_url = "notaurl"\n')
    from_file = bpgw("status", "--config", str(config), cwd=tmp_path)
    line = _one_line(from_file.stderr)
    assert from_file.returncode == 2 and "state.redis_url" in line
    for command in (("status",), ("show", "lotbot-1"), ("sweep", "--once")):
        proc = bpgw(*command, "--redis-url", "notaurl", cwd=tmp_path)
        assert (proc.returncode, proc.stdout, _one_line(proc.stderr)) == (2, "", line)
    assert "must be 'embedded' or a URL such as redis://host:6379/0" in line
    # A URL of the right scheme with a port that is not a number.
    proc = bpgw("show", "lotbot-1", "--redis-url", "redis://127.0.0.1:abc", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "state.redis_url: bad port: Port could not be cast" in _one_line(proc.stderr)
    assert sorted(tmp_path.iterdir()) == [config]


def test_read_commands_create_no_data_folder(tmp_path: Path) -> None:
    for command in READ_COMMANDS:
        proc = bpgw(*command, cwd=tmp_path)
        assert proc.returncode == 1 and proc.stdout == "", proc.stderr
        line = _one_line(proc.stderr)
        assert f"embedded Valkey of data folder {tmp_path / '.bpgw'}" in line
        assert "holds no data" in line
        assert all(hint in line for hint in ("--config", "--redis-url", "--data-dir"))
    other = tmp_path / "elsewhere"
    proc = bpgw("status", "--json", "--data-dir", str(other), cwd=tmp_path)
    assert proc.returncode == 1 and str(other) in proc.stderr
    assert sorted(tmp_path.iterdir()) == []


def test_config_data_dir_is_relative_to_the_config_file(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "gw.toml").write_text('[gateway]\ndata_dir = "state"\n')
    proc = bpgw("status", "--config", "conf/gw.toml", cwd=tmp_path)
    assert proc.returncode == 1 and f"data folder {conf / 'state'}," in proc.stderr
    # --data-dir overrides the file, relative to the current folder like any option.
    proc = bpgw("status", "--config", "conf/gw.toml", "--data-dir", "mine", cwd=tmp_path)
    assert proc.returncode == 1 and f"data folder {tmp_path / 'mine'}," in proc.stderr


def test_run_honours_data_dir_over_the_config(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    config = conf / "gw.toml"
    config.write_text(
        '[gateway]\ndata_dir = "from-config"\nlog_format = "text"\n'
        '[transports.http]\nport = 0\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "run", "--config", str(config),
         "--data-dir", "from-flag"],
        cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        banner = [proc.stdout.readline() for _ in range(3)]
        assert banner[0].startswith("bpgw gateway 'bpgw' running"), banner
        assert f"data in {tmp_path / 'from-flag' / 'valkey'}" in banner[1], banner
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    assert "shutting down" in out and "Traceback" not in err
    assert (tmp_path / "from-flag" / "valkey").is_dir()
    assert not (conf / "from-config").exists() and not (tmp_path / "from-config").exists()


def test_run_port_with_config_is_refused_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "gw.toml"
    config.write_text("")
    proc = bpgw("run", "--config", str(config), "--port", "9999", cwd=tmp_path)
    assert proc.returncode == 2 and "--port" in _one_line(proc.stderr)


def test_run_on_a_taken_port_says_one_line_and_tears_down_quietly(
    tmp_path: Path, redis_url: str, namespace: str, taken_port: int
) -> None:
    config = tmp_path / "gw.toml"
    config.write_text(
        f'[gateway]\nlog_format = "text"\n'
        f'[state]\nredis_url = "{redis_url}"\nnamespace = "{namespace}"\n'
        f"[transports.http]\nport = {taken_port}\n"
    )
    for _ in range(3):  # the sweep that runs at start races the failure: try a few times
        proc = bpgw("run", "--config", str(config), cwd=tmp_path)
        assert proc.returncode == 1
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        # Only the normal start and stop lines (INFO logs) besides the one failure line.
        (failure,) = [line for line in lines if not re.search(r"\b(INFO|info)\b", line)]
        assert failure.startswith("bpgw: cannot start: ") and "address already in use" in failure
        assert len(lines) <= 3, lines


def _check_config(tmp_path: Path, redis_url: str, namespace: str, port: int) -> Path:
    config = tmp_path / "gw.toml"
    config.write_text(
        f'[state]\nredis_url = "{redis_url}"\nnamespace = "{namespace}"\n'
        f'[transports.http]\nport = {port}\n[transports.http.tokens]\nLotbot = "lotbot-token"\n'
    )
    return config


def _rows(out: str) -> dict[str, str]:
    """The verdict of each check in the table (check name -> ok, warn or FAIL)."""
    rows = {}
    for line in out.splitlines():
        if line[:4].strip() in ("ok", "warn", "FAIL"):
            verdict, rest = line[:4].strip(), line[6:]
            rows[rest.split("  ")[0].strip()] = verdict
    return rows


def test_check_ready_config_exits_0(tmp_path: Path, redis_url: str, namespace: str) -> None:
    port = free_port()
    config = _check_config(tmp_path, redis_url, namespace, port)
    proc = bpgw("check", "--config", str(config), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _rows(proc.stdout)
    assert rows["configuration"] == rows["state store"] == "ok", proc.stdout
    assert rows["state store: memory"] == "ok"
    assert {k: v for k, v in rows.items() if k.startswith("transport http")} == {
        f"transport http: listen 127.0.0.1:{port}": "ok",
        "transport http: tokens": "ok",
    }
    assert proc.stdout.rstrip().splitlines()[-1].startswith("ready")
    assert re.search(r"^ok +state store +(Redis|Valkey) \d", proc.stdout, re.M)


def test_check_fails_with_the_fix(
    tmp_path: Path, redis_url: str, namespace: str, taken_port: int
) -> None:
    config = _check_config(tmp_path, redis_url, namespace, taken_port)
    proc = bpgw("check", "--config", str(config), cwd=tmp_path)
    assert proc.returncode == 1
    assert _rows(proc.stdout)[f"transport http: listen 127.0.0.1:{taken_port}"] == "FAIL"
    assert "is taken" in proc.stdout and "fix: stop what listens there" in proc.stdout
    assert "[transports.http] port" in proc.stdout
    assert proc.stdout.rstrip().endswith("not ready: 1 check(s) failed")

    dead = _check_config(tmp_path, f"redis://127.0.0.1:{free_port()}/0", namespace, 0)
    proc = bpgw("check", "--config", str(dead), "--json", cwd=tmp_path)
    assert proc.returncode == 1
    found = json.loads(proc.stdout)
    state = next(c for c in found["checks"] if c["check"] == "state store")
    assert found["ready"] is False and state["status"] == "FAIL"
    assert "cannot connect" in state["detail"] and "start Redis there" in state["fix"]

    bad = tmp_path / "bad.toml"
    bad.write_text('[state]\nredis_url = "notaurl"\n')
    proc = bpgw("check", "--config", str(bad), cwd=tmp_path)
    assert proc.returncode == 1 and "FAIL  configuration" in proc.stdout
    assert "state.redis_url" in proc.stdout and "fix: correct the key" in proc.stdout


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of running processes that contain ``text``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(args)
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to find left-over servers")
def test_demo_stopped_by_sigterm_leaves_no_servers_or_folder() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "demo"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(), text=True,
    )
    try:
        assert proc.stdout is not None
        data_dir = ""
        for line in proc.stdout:
            if found := re.search(r"data in (\S+?)/valkey", line):
                data_dir = found.group(1)
            if line.startswith("AINET agent"):  # embedded Valkey, NATS and AINET all up
                break
        assert data_dir, "the demo never said where its data lives"
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, 128 + signal.SIGTERM)
    assert not Path(data_dir).exists()
    assert _processes_mentioning(data_dir) == []


def test_a_redis_password_is_never_printed(tmp_path: Path) -> None:
    # Nothing listens on the port: every command fails and says where it looked.
    url = f"redis://bpgw:s3cret-pw@127.0.0.1:{free_port()}/0"
    for command in (("status", "--redis-url", url), ("show", "x-1", "--redis-url", url),
                    ("check",)):
        proc = bpgw(*command, cwd=tmp_path, env={"BPGW_STATE__REDIS_URL": url})
        assert proc.returncode == 1, proc.stdout + proc.stderr
        said = proc.stdout + proc.stderr
        assert "s3cret-pw" not in said and "redis://bpgw:***@127.0.0.1" in said, said


def test_status_says_which_store_it_read_and_that_it_is_empty(
    tmp_path: Path, redis_url: str, namespace: str
) -> None:
    proc = bpgw("status", "--redis-url", redis_url, "--namespace", namespace, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"state: {redis_url}, namespace {namespace!r}", lines
    assert "no conversations in this store and namespace" in lines[2]
    assert "--namespace NS" in lines[2] and "open load by agent: none" in lines
