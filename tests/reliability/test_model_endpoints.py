"""A model endpoint (``ragen-trainer eval --engine openai``) that fails: real HTTP servers on 127.0.0.1
(:mod:`tests.reliability.hostile_http`) that trickle bytes, never answer, answer 500 / 429, reset the connection, cut
the answer short, speak no HTTP, or answer garbage.

What must hold: every request ends within its deadline (not per read); transient failures are retried, refusals are
not; a malformed answer is a clear error of its own episode, a malformed ``usage`` costs nothing; a dead endpoint is
given up on; an eval most of whose episodes failed on the endpoint exits non-zero, is marked ``engine_failed`` and is
not ranked; Ctrl-C stops a hanging eval within seconds and keeps the finished envs (a second Ctrl-C exits at once).
Deadlines are short (1 s); wall-clock bounds are generous (they prove "stops", not speed).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragen_trainer.engines import GenerationRequest, SamplingParams
from ragen_trainer.engines.openai import OpenAIEngine, OpenAIEngineError
from ragen_trainer.evaluation.cli import main as eval_main
from ragen_trainer.evaluation.leaderboard import build_leaderboard
from ragen_trainer.evaluation.schema import ResultFileWarning
from tests.reliability.hostile_http import (
    RawServer,
    answer,
    bad_status_line,
    completion,
    cut_short,
    hold,
    reset,
    sequence,
)

ROOT = Path(__file__).resolve().parents[2]
HI = [{"role": "user", "content": "hi"}]
#: Generous: a deadline of 1 s must end a request well within this (it proves the request stops).
STOPS_WITHIN = 30.0


def _engine(server: RawServer, **kwargs) -> OpenAIEngine:
    kwargs = {"timeout": 1.0, "max_retries": 0, "backoff": 0.0, **kwargs}
    return OpenAIEngine("m", server.url, **kwargs)


def _session_results(engine: OpenAIEngine, conversations: list[list[dict]]) -> list:
    """Every conversation through one session (as the rollout plays them), results in order."""
    out = {}
    with engine.session(SamplingParams(max_new_tokens=8)) as session:
        for k, messages in enumerate(conversations):
            session.submit(GenerationRequest(k, messages=messages, seed=k))
        while session.busy:
            out.update(session.step())
    return [out[k] for k in range(len(conversations))]


# ------------------------------------------------------------------------------------------------ deadlines
@pytest.mark.parametrize("behaviour", [hold(60, trickle=b'{"choices": '), hold(60)], ids=["trickles", "never-answers"])
def test_a_request_ends_at_its_overall_deadline(behaviour):
    """A server trickling one byte every 0.2 s never trips a per-read timeout; the 1 s deadline still ends it."""
    with RawServer(behaviour) as server:
        start = time.monotonic()
        with pytest.raises(OpenAIEngineError, match=r"no complete answer within 1 s"):
            _engine(server, max_retries=1).generate_chat([HI], SamplingParams())
        assert time.monotonic() - start < STOPS_WITHIN
        assert len(server.requests) == 2  # the timeout is transient: tried again once


# ------------------------------------------------------------------------------------------------ retries
TRANSIENT = {
    "http-500": answer(500, {"error": {"message": "boom"}}),
    "http-503": answer(503, b"<html>overloaded</html>"),
    "http-429-retry-after": answer(429, {"error": {"message": "slow down"}}, {"Retry-After": "0"}),
    "connection-reset": reset,
    "incomplete-read": cut_short,
    "bad-status-line": bad_status_line,
}


@pytest.mark.parametrize("name", list(TRANSIENT))
def test_transient_failures_are_retried(name):
    with RawServer(sequence(TRANSIENT[name], answer(200, completion("<answer>Dragon</answer>")))) as server:
        results = _engine(server, max_retries=2).generate_chat([HI], SamplingParams())
    assert results[0].text == "<answer>Dragon</answer>" and results[0].error is None
    assert len(server.requests) == 2


def test_a_refusal_is_not_retried_and_names_the_status():
    refusal = answer(400, {"error": {"message": "context length exceeded"}})
    with RawServer(refusal) as server, pytest.raises(OpenAIEngineError, match=r"HTTP 400: context length exceeded") as err:
        _engine(server, max_retries=3).generate_chat([HI], SamplingParams())
    assert err.value.status == 400 and len(server.requests) == 1


# ------------------------------------------------------------------------------------------------ malformed answers
MALFORMED = {
    "not-utf8": (answer(200, b'{"choices": [{"message": {"content": "\xff\xfe caf\xe9"}}]}'), "not UTF-8"),
    "not-json": (answer(200, b"<html>Bad gateway</html>"), "not JSON"),
    "json-list": (answer(200, [1, 2, 3]), "not an object"),
    "no-choices": (answer(200, {"choices": []}), "not a chat completion"),
    "content-not-text": (answer(200, {"choices": [{"message": {"content": {"a": 1}}}]}), "content is not text"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_answer_is_an_error_of_its_own_request(name):
    """The bad answer fails its request with a clear message; the other request of the same session is fine."""
    bad, words = MALFORMED[name]

    def behave(conn, request):
        (bad if "bad" in request.conversation() else answer(200, completion()))(conn, request)

    with RawServer(behave) as server:
        good, failed = _session_results(_engine(server), [HI, [{"role": "user", "content": "bad"}]])
    assert good.error is None and good.text == "<answer>Dragon</answer>"
    assert failed.error is not None and words in failed.error and failed.text == ""
    assert "Traceback" not in failed.error


@pytest.mark.parametrize("usage", ["lots", {"prompt_tokens": "x", "completion_tokens": None}, [1], 7])
def test_a_malformed_usage_keeps_the_completion(usage):
    with RawServer(answer(200, completion("<answer>Phoenix</answer>", usage=usage))) as server:
        engine = _engine(server)
        results = engine.generate_chat([HI], SamplingParams())
    assert results[0].text == "<answer>Phoenix</answer>"
    assert engine.usage == {"prompt_tokens": 0, "completion_tokens": 0, "requests": 1}


def test_a_dead_endpoint_is_given_up_on():
    """After give_up_after replies failed in a row the rest fail at once, unsent."""
    with RawServer(answer(500, {"error": {"message": "down"}})) as server:
        results = _session_results(_engine(server, give_up_after=2, concurrency=1), [HI] * 6)
    assert len(server.requests) == 2
    assert all(r.error for r in results) and "not sent" in results[-1].error and "HTTP 500: down" in results[-1].error


# ------------------------------------------------------------------------------------------------ the eval command
def _eval(server: RawServer, out: Path, *extra: str) -> list[str]:
    return ["eval", "--engine", "openai", "--model", "served", "--base-url", server.url, "--suite", "bandit-bare-v2",
            "--max-states", "2", "--no-progress", "--retry-backoff", "0", "-o", str(out), *extra]  # fmt: skip


def test_an_eval_on_a_failing_endpoint_exits_non_zero_and_is_not_ranked(tmp_path, capsys):
    out = tmp_path / "served.json"
    with RawServer(hold(60)) as server:  # never answers: the deadline, then giving up, keep it short
        start = time.monotonic()
        rc = eval_main(_eval(server, out, "--request-timeout", "1", "--max-retries", "0", "--give-up-after", "2"))
        assert time.monotonic() - start < STOPS_WITHIN
    err = capsys.readouterr().err
    assert rc == 1 and "failed on the engine" in err and "engine_failed" in err
    result = json.loads(out.read_text())
    assert result["summary"]["overall"]["engine_failed"] is True
    assert result["summary"]["overall"]["engine_errors"] == result["summary"]["overall"]["episodes"] == 6
    assert {e["error_kind"] for e in result["episodes"]} == {"engine"}
    assert "no complete answer within 1 s" in result["episodes"][0]["error"]

    oracle = tmp_path / "oracle.json"
    assert eval_main(["eval", "--agent", "oracle", "--suite", "bandit-bare-v2", "--max-states", "2", "--no-progress",
                      "-o", str(oracle)]) == 0  # fmt: skip
    with pytest.warns(ResultFileWarning, match="failed on the engine"):
        markdown, _ = build_leaderboard([out, oracle])
    assert "| oracle |" in markdown and "served" not in markdown


def test_an_env_the_endpoint_failed_is_played_again_next_time(tmp_path, capsys):
    """One env of three failed (500s): the result is written and ranked (a third is not most), the other envs stay in
    the checkpoint, and the same command later plays only the failed env again."""
    out = tmp_path / "served.json"
    down = [True]

    def flaky(conn, request):
        failing = down[0] and "Librarian" in request.conversation()  # BanditTest's arm names
        (answer(500, {"error": {"message": "down"}}) if failing else answer(200, completion()))(conn, request)

    with RawServer(flaky) as server:
        assert eval_main(_eval(server, out, "--max-retries", "0")) == 0
        err = capsys.readouterr().err
        assert "2 of 2 episodes of BanditTest failed on the engine" in err and ".partial" in err
        partial = json.loads(out.with_name(out.name + ".partial").read_text())
        assert sorted(partial["env_seconds"]) == ["Bandit", "BanditRev"]

        down[0] = False  # the endpoint is back
        before = len(server.requests)
        assert eval_main(_eval(server, out)) == 0
        asked = [r.conversation() for r in server.requests[before:]]
    assert "already done" in capsys.readouterr().err
    assert len(asked) == 2 and all("Librarian" in text for text in asked)
    assert json.loads(out.read_text())["summary"]["overall"]["engine_errors"] == 0
    assert not out.with_name(out.name + ".partial").exists()


# ------------------------------------------------------------------------------------------------ Ctrl-C
def test_ctrl_c_stops_a_hanging_eval_and_keeps_the_finished_envs(tmp_path):
    out = tmp_path / "served.json"

    def behave(conn, request):  # Bandit answers, BanditTest hangs
        (hold(60) if "Librarian" in request.conversation() else answer(200, completion()))(conn, request)

    with RawServer(behave) as server:
        proc = subprocess.Popen([sys.executable, "-m", "ragen_trainer.cli", *_eval(server, out)], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 120
        while not any("Librarian" in r.conversation() for r in server.requests):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=STOPS_WITHIN)
        assert time.monotonic() - start < STOPS_WITHIN
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err and ".partial" in err
    partial = json.loads(out.with_name(out.name + ".partial").read_text())
    assert list(partial["env_seconds"]) == ["Bandit"] and not out.exists()


SECOND_CTRL_C = """
import os, signal, sys, time
from pathlib import Path
from ragen_trainer.evaluation.cli import second_interrupt_exits
with second_interrupt_exits(lambda: "the finished envs are kept in x.partial"):
    try:
        print("ready", flush=True)
        time.sleep(60)
    except KeyboardInterrupt:
        print("cleaning up", flush=True)
        time.sleep(60)  # a cleanup that hangs
print("not reached", flush=True)
"""


def test_a_second_ctrl_c_exits_at_once():
    proc = subprocess.Popen([sys.executable, "-c", SECOND_CTRL_C], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    assert proc.stdout.readline().strip() == "cleaning up"
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=STOPS_WITHIN)
    assert time.monotonic() - start < STOPS_WITHIN
    assert proc.returncode == 130 and "not reached" not in out
    assert "stopping now" in err and "x.partial" in err
