"""Every expected failure of an operator command is one line on stderr, never a traceback.

The API is a local ``http.server`` on 127.0.0.1 answering from a script; the requests are
signed with throwaway keys from the environment (nothing leaves this machine).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.credentials import Credentials
from botocore.exceptions import NoCredentialsError, TokenRetrievalError

from swarm.cli import ops
from swarm.client import Client, Target
from swarm.core.files import write_atomically
from tests.unit.helpers import run_cli

Answer = Callable[[BaseHTTPRequestHandler], None]


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeApi:
    """Answers each request with the next of ``answers`` (the last one again when they run
    out) and records what it was sent."""

    url: str
    answers: list[Answer] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)

    def next_answer(self) -> Answer:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def json_answer(status: int, doc: Any, headers: dict[str, str] | None = None) -> Answer:
    return raw_answer(status, json.dumps(doc).encode(), "application/json", headers)


def raw_answer(
    status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
) -> Answer:
    def answer(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            h.send_header(name, value)
        h.end_headers()
        h.wfile.write(body)

    return answer


def late(seconds: float, then: Answer) -> Answer:
    """Answer after ``seconds`` (longer than the client waits: it has given up by then)."""

    def answer(h: BaseHTTPRequestHandler) -> None:
        time.sleep(seconds)
        with contextlib.suppress(OSError):  # the client hung up meanwhile
            then(h)

    return answer


def hang_up(h: BaseHTTPRequestHandler) -> None:
    h.close_connection = True
    h.connection.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def api() -> Iterator[FakeApi]:
    fake = FakeApi(url="")

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            fake.seen.append(
                Seen(
                    self.command,
                    self.path,
                    dict(self.headers.items()),
                    json.loads(raw) if raw else None,
                )
            )
            fake.next_answer()(self)

        do_GET = do_POST = do_PUT = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Throwaway keys from the environment only: no profile, no config file, no IMDS."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.chdir(tmp_path)  # no .swarm/local.json of the checkout
    monkeypatch.setattr(ops, "REQUEST_TIMEOUT_S", 0.3)
    monkeypatch.setattr(ops, "RETRY_BACKOFF_S", 0.01)


def one_error_line(result: tuple[int, str, str], status: int = 2) -> str:
    code, _, err = result
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert code == status, err
    assert len(lines) == 1 and lines[0].startswith("swarm: error: "), err
    return lines[0]


def refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


BATCH = {"batch_id": "b-1", "units": 3, "lane": "normal", "tokens": {"budget": 30_000}}
DONE = {
    "batch_id": "b-1",
    "state": "completed",
    "units": 3,
    "counts": {
        "completed": 3,
        "dead_lettered": 0,
        "remainder": 0,
        "running": 0,
        "queued": 0,
        "pending": 0,
    },
    "tokens": {"spent": 20_000, "budget": 30_000},
    "healthy_line": "run.completed: completed 3/3",
}


# ------------------------------------------------------------------ the transport


def test_connection_refused_says_to_check_the_stack(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{refused_port()}"
    line = one_error_line(run_cli(["fleet", "--api-url", url], capsys))
    assert line.startswith(f"swarm: error: cannot reach {url}/fleet: "), line
    assert "check that the stack is deployed" in line


def test_the_local_stack_not_up_says_swarm_local_up(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    Target(
        api_url=f"http://127.0.0.1:{refused_port()}",
        region="us-east-1",
        drain_parameter="/swarm/local/drain",
        aws_endpoint="http://127.0.0.1:1",
        tenant="demo",
    ).save()
    # the emulator's role is taken as given: the API itself is what is down
    monkeypatch.setattr(Client, "_local_role", lambda self, role: Credentials("a", "b"))
    line = one_error_line(run_cli(["status", "b-1"], capsys))
    assert "cannot reach" in line and "start it with `swarm local up`" in line, line


def test_a_host_that_does_not_resolve_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_such_host(*args: Any, **kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    line = one_error_line(run_cli(["fleet", "--api-url", "http://swarm.invalid"], capsys))
    assert line.startswith("swarm: error: cannot reach http://swarm.invalid/fleet: "), line
    assert "Name or service not known" in line


def test_a_read_timeout_of_a_read_says_nothing_changed(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.answers = [late(1.0, json_answer(200, DONE))]
    line = one_error_line(run_cli(["status", "b-1", "--api-url", api.url], capsys))
    assert line.startswith(f"swarm: error: no answer from {api.url}/batches/b-1: timed out")
    assert "nothing was changed; try again" in line


def test_a_read_timeout_of_a_change_says_it_may_have_been_applied(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.answers = [late(1.0, json_answer(200, {"requeued": 0}))]
    args = ["resume", "b-1", "--top-up", "5", "--api-url", api.url]
    line = one_error_line(run_cli(args, capsys))
    assert "timed out after 0.3s" in line
    assert "may still have been applied" in line and "swarm status b-1" in line, line


def test_a_connection_dropped_without_an_answer_is_one_line(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.answers = [hang_up]
    line = one_error_line(run_cli(["fleet", "--api-url", api.url], capsys))
    assert line.startswith(f"swarm: error: no answer from {api.url}/fleet: "), line


# ------------------------------------------------------------------ HTTP answers


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (
            json_answer(404, {"error": "not_found", "message": "no batch 'b-1'"}),
            ["swarm: error: 404 not_found: no batch 'b-1'"],
        ),
        (
            json_answer(
                503, {"error": "draining", "message": "intake is stopped"}, {"Retry-After": "30"}
            ),
            ["swarm: error: 503 draining: intake is stopped (retry after 30s)"],
        ),
        (
            json_answer(500, {"error": "misconfigured", "message": "see the logs"}),
            ["500 misconfigured: see the logs", "the service failed (HTTP 500), not your request"],
        ),
        (
            raw_answer(502, b"<html>\n<body>Bad Gateway</body>\n</html>\n", "text/html"),
            ["502 bad_gateway: ", "not the API's JSON", "the service failed (HTTP 502)"],
        ),
        (
            json_answer(403, {"message": "The security token included in the request is expired"}),
            ["403 forbidden: The security token included in the request is expired", "sso"],
        ),
        (
            raw_answer(404, b"<html>nothing here</html>", "text/html"),
            ["404 not_found: ", "is http://127.0.0.1:", "the swarm API?"],
        ),
    ],
)
def test_an_http_error_is_one_line_with_the_apis_message(
    api: FakeApi, answer: Answer, expected: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    api.answers = [answer]
    line = one_error_line(run_cli(["status", "b-1", "--api-url", api.url], capsys))
    for part in expected:
        assert part in line, (part, line)


def test_an_answer_that_is_not_json_is_one_line(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.answers = [raw_answer(200, b"<html>\nnot the swarm API\n</html>", "text/html")]
    line = one_error_line(run_cli(["fleet", "--api-url", api.url], capsys))
    assert line == f"swarm: error: {api.url}/fleet did not answer with JSON: is it the swarm API?"


@pytest.mark.parametrize(
    "command", [["fleet"], ["status", "b1"], ["drain", "status"], ["submit", "--generate", "2"]]
)
def test_json_that_is_not_the_swarm_apis_is_one_line(
    api: FakeApi, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    api.answers = [raw_answer(200, b'{"hello": "world"}', "application/json")] * 4
    line = one_error_line(run_cli([*command, "--api-url", api.url], capsys))
    assert line.startswith("swarm: error: the answer is not the swarm API's (no "), line


# ------------------------------------------------------------------ AWS credentials


def test_no_aws_credentials_say_how_to_get_them(
    api: FakeApi, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    line = one_error_line(run_cli(["fleet", "--api-url", api.url], capsys))
    assert "no AWS credentials" in line and "aws sso login" in line, line
    assert api.seen == []


def test_expired_aws_credentials_say_how_to_refresh_them(
    api: FakeApi, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def expired(self: Any) -> Any:
        raise TokenRetrievalError(provider="sso", error_msg="Token has expired")

    monkeypatch.setattr(boto3.session.Session, "get_credentials", expired)
    line = one_error_line(run_cli(["fleet", "--api-url", api.url], capsys))
    assert "Token has expired" in line and "aws sso login" in line, line


def test_a_stack_read_without_credentials_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class NoKeys:
        def describe_stacks(self, **kwargs: Any) -> Any:
            raise NoCredentialsError()

    monkeypatch.setattr(boto3, "client", lambda *args, **kwargs: NoKeys())
    line = one_error_line(run_cli(["fleet", "--stack", "Swarm-prod"], capsys))
    assert "cannot read stack 'Swarm-prod'" in line and "aws sso login" in line, line


def test_a_botocore_error_reaching_main_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_keys(args: Any) -> Any:
        raise NoCredentialsError()

    monkeypatch.setattr(ops, "client_of", no_keys)
    line = one_error_line(run_cli(["fleet"], capsys))
    assert "Unable to locate credentials" in line and "aws sso login" in line, line


# ------------------------------------------------------------------ submit, retried


def test_a_submit_that_times_out_is_retried_with_the_same_key_and_makes_one_batch(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.answers = [late(1.0, json_answer(201, BATCH)), json_answer(200, BATCH)]
    code, out, err = run_cli(["submit", "--generate", "3", "--api-url", api.url], capsys)
    assert code == 0 and "Traceback" not in err, err
    posts = [s for s in api.seen if s.method == "POST"]
    keys = [s.headers.get("Idempotency-Key") for s in posts]
    assert len(posts) == 2 and keys[0] and keys[0] == keys[1], keys
    assert posts[0].body == posts[1].body
    lines = out.strip().splitlines()
    assert [x for x in lines if x.startswith("batch ")] == [
        "batch b-1: 3 units on the normal lane, budget 30,000 tokens"
    ]
    assert any("timed out" in x and "same Idempotency-Key" in x for x in lines), lines


def test_a_given_idempotency_key_is_sent_and_retried(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.answers = [hang_up, json_answer(200, BATCH)]
    args = ["submit", "--generate", "3", "--idempotency-key", "k-1", "--json"]
    code, out, err = run_cli([*args, "--api-url", api.url], capsys)
    assert code == 0 and json.loads(out) == BATCH  # stdout: only the JSON
    assert [s.headers.get("Idempotency-Key") for s in api.seen] == ["k-1", "k-1"]
    assert "retry 1 of 3" in err and "Traceback" not in err


def test_each_submit_has_a_key_of_its_own(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.answers = [json_answer(201, BATCH)]
    for _ in range(2):
        assert run_cli(["submit", "--generate", "1", "--api-url", api.url], capsys)[0] == 0
    keys = {s.headers.get("Idempotency-Key") for s in api.seen}
    assert len(keys) == 2 and None not in keys


def test_a_submit_that_never_gets_an_answer_says_how_to_repeat_it_safely(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.answers = [late(1.0, json_answer(201, BATCH))]
    result = run_cli(["submit", "--generate", "3", "--api-url", api.url], capsys)
    line = one_error_line(result)
    key = api.seen[0].headers["Idempotency-Key"]
    assert len(api.seen) == 1 + ops.SUBMIT_RETRIES
    assert {s.headers["Idempotency-Key"] for s in api.seen} == {key}
    assert "(4 attempts)" in line and f"--idempotency-key {key}" in line, line
    assert result[1].count("sending the submit again") == ops.SUBMIT_RETRIES


def test_a_watch_survives_a_status_check_that_times_out(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.answers = [late(1.0, json_answer(200, DONE)), json_answer(200, DONE)]
    args = ["status", "b-1", "--watch", "--api-url", api.url]
    code, out, err = run_cli(args, capsys)
    assert code == 0 and err == "", err
    assert "status check failed" in out and out.strip().endswith("run.completed: completed 3/3")


# ------------------------------------------------------------------ submit --upload


def upload_answer(api: FakeApi, size: int) -> Answer:
    """``POST /uploads``'s answer, its URL on the fake server (as S3's would be elsewhere)."""
    key = "manifests/uploads/acme/0123.json"
    return json_answer(
        200,
        {
            "key": key,
            "url": f"{api.url}/bucket/{key}?X-Amz-Signature=abc",
            "method": "PUT",
            "headers": {
                "Content-Type": "application/json",
                "Content-Length": str(size),
                "If-None-Match": "*",
            },
            "expires_in_s": 300,
            "expires_at": 1_700_000_300,
        },
    )


def test_submit_upload_puts_the_units_at_the_url_then_submits_the_key(
    api: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    units = [{"unit_id": f"u{i}", "projected_tokens": 10, "input": "é"} for i in range(3)]
    path = tmp_path / "units.json"
    path.write_text(json.dumps({"units": units, "budget": 500}))
    size = len(json.dumps(units, separators=(",", ":"), ensure_ascii=False).encode())
    api.answers = [
        upload_answer(api, size),
        raw_answer(200, b"", "text/plain"),
        json_answer(201, BATCH),
    ]
    code, out, err = run_cli(
        ["submit", str(path), "--upload", "--lane", "low", "--api-url", api.url], capsys
    )
    assert code == 0 and "Traceback" not in err, err
    ask, put, submit = api.seen
    assert (ask.method, ask.path, ask.body) == ("POST", "/uploads", {"size_bytes": size})
    # the PUT: the answer's URL, headers and the units, unsigned by the caller (the URL is)
    assert (put.method, put.path) == (
        "PUT",
        "/bucket/manifests/uploads/acme/0123.json?X-Amz-Signature=abc",
    )
    assert put.body == units and "Authorization" not in put.headers
    assert put.headers["Content-Length"] == str(size) and put.headers["If-None-Match"] == "*"
    assert put.headers["Content-Type"] == "application/json"
    # the submit names the key instead of carrying the units
    assert (submit.method, submit.path) == ("POST", "/batches")
    assert submit.body == {
        "budget": 500,
        "lane": "low",
        "manifest": {"key": "manifests/uploads/acme/0123.json"},
    }
    assert "uploaded 3 units" in out and "to manifests/uploads/acme/0123.json" in out


def test_submit_upload_refused_by_s3_is_one_line_and_submits_nothing(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    refusal = b"<Error><Code>SignatureDoesNotMatch</Code><Message>...</Message></Error>"
    units = ops.generated_units(2, 0, 8_000, 16_000)  # what --generate 2 makes
    size = len(json.dumps(units, separators=(",", ":")).encode())
    api.answers = [upload_answer(api, size), raw_answer(403, refusal, "application/xml")]
    line = one_error_line(
        run_cli(["submit", "--generate", "2", "--upload", "--api-url", api.url], capsys)
    )
    assert "HTTP 403 (SignatureDoesNotMatch)" in line and "X-Amz-Signature" not in line, line
    assert [s.method for s in api.seen] == ["POST", "PUT"]


def test_submit_upload_of_a_manifest_reference_is_one_line(
    api: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "ref.json"
    path.write_text(json.dumps({"manifest": {"key": "manifests/uploads/acme/x.json"}}))
    line = one_error_line(run_cli(["submit", str(path), "--upload", "--api-url", api.url], capsys))
    assert line.startswith("swarm: error: --upload: the FILE names a manifest already"), line
    assert api.seen == []


def test_a_generated_batch_names_the_models_of_its_mix(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.answers = [json_answer(201, BATCH)]
    args = ["submit", "--generate", "10", "--mix", "haiku=0.7,sonnet=0.3", "--seed", "4"]
    code, _, err = run_cli([*args, "--api-url", api.url], capsys)
    assert code == 0, err
    [post] = [s for s in api.seen if s.method == "POST"]
    units = post.body["units"]
    models = [u["input"]["model"] for u in units]
    assert sorted(models) == ["haiku"] * 7 + ["sonnet"] * 3  # the mix's counts, exactly
    # a prompt text became a request of one user message carrying it
    assert all(u["input"]["messages"][0]["content"][0]["text"] for u in units)
    # drawn on the seed: the same seed, the same models
    api.answers = [json_answer(201, BATCH)]
    run_cli([*args, "--api-url", api.url], capsys)
    again = [s for s in api.seen if s.method == "POST"][-1]
    assert [u["input"]["model"] for u in again.body["units"]] == models


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--mix", "haiku=0.7,sonnet=0.2"], "--mix: the fractions add up to 0.9, not 1"),
        (["--mix", "haiku"], "--mix: 'haiku' is not name=fraction"),
    ],
)
def test_a_bad_mix_is_one_line_naming_the_option(
    api: FakeApi, capsys: pytest.CaptureFixture[str], extra: list[str], says: str
) -> None:
    line = one_error_line(
        run_cli(["submit", "--generate", "3", *extra, "--api-url", api.url], capsys)
    )
    assert says in line, line
    assert api.seen == []  # nothing sent


def test_the_target_file_is_replaced_whole_or_not_at_all(tmp_path: Path) -> None:
    # `swarm local up` polls for the stack's local.json and reads it as soon as it exists: a
    # file opened for writing but not yet written failed one CI run ("is damaged")
    path = tmp_path / "local.json"
    first = Target("http://127.0.0.1:1", "us-east-1", "/swarm/local/drain", "http://127.0.0.1:2")
    first.save(path)
    assert Target.load(path) == first
    with pytest.raises(UnicodeEncodeError):  # fails at the write, after the file is opened
        write_atomically(path, '{"api_url": "http://127.0.0.1:3"\ud800}')
    assert Target.load(path) == first  # the previous file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local.json"]  # no temporary left
