"""Servers stay local unless asked (issue 35, "Trust no file and no port").

* A vLLM server in development mode (``VLLM_SERVER_DEV_MODE=1``, which the weight push needs) answers
  ``/collective_rpc`` without authentication, so the run's config refuses an ``engine_url`` whose host is not a
  loopback address unless ``allow_remote_engine`` is set (then it warns).
* Every server command the docs, the README, the scripts and the examples show binds 127.0.0.1: vLLM's and TRL's
  servers listen on every interface without ``--host``, so theirs must say ``--host 127.0.0.1``; servers whose own
  default is loopback (``webshop-server``, ``transformers serve``) may leave it out, never name another address.
* The folder a vLLM server reloads the weights from (``<output_dir>/vllm-weights``) is made with the umask's modes
  (never world-writable; safetensors alone writes ``0600``), and one that another user owns is refused.
"""

from __future__ import annotations

import ast
import inspect
import os
import pwd
import re
import stat
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from ragen_trainer import cli
from ragen_trainer.config import StarPOConfig

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from ragen_trainer.engines.vllm import (  # noqa: E402
    WEIGHTS_FILE,
    VLLMEngine,
    prepare_weights_dir,
    write_weights_for_reload,
)
from webshop_server.app import make_server, start_in_thread  # noqa: E402
from webshop_server.cli import _parser as webshop_parser  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

REMOTE_URLS = [
    "http://0.0.0.0:8000",  # where a server listens, not an address to reach
    "http://[::]:8000",
    "http://192.168.1.5:8000",  # a LAN address
    "http://10.0.0.7:8000/",
    "https://203.0.113.9",  # a public one
    "http://gpu-node:8000",  # host names other than localhost: DNS decides where they go
    "http://localhost.example.com:8000",
    "http://127.0.0.1.nip.io:8000",
    "http://[2001:db8::1]:8000",  # IPv6 global
    "http://[fe80::1]:8000",  # IPv6 link-local
    "http://[::ffff:10.0.0.1]:8000",  # IPv4-mapped, not loopback
]
LOOPBACK_URLS = [
    "http://127.0.0.1:8000",
    "http://127.1.2.3:8000",  # all of 127.0.0.0/8
    "http://[::1]:8000",
    "http://localhost:8000",
    "http://LOCALHOST:8000/",
    "https://localhost",
    "http://[::ffff:127.0.0.1]:8000",  # IPv4-mapped loopback
]


# ------------------------------------------------------------------------------------------------ engine_url
@pytest.mark.parametrize("url", REMOTE_URLS)
def test_an_engine_url_on_another_host_is_refused(url):
    with pytest.raises(ValueError) as info:
        StarPOConfig(engine="vllm", engine_url=url).validate()
    message = str(info.value)
    assert f"engine_url={url!r}" in message  # names the URL
    assert "without authentication" in message and "/collective_rpc" in message  # why
    assert "--allow_remote_engine true" in message  # and the way to allow it
    assert "127.0.0.0/8" in message  # what is accepted


def test_an_unspecified_address_gets_the_address_to_use():
    with pytest.raises(ValueError, match=r"0\.0\.0\.0 / :: is what a server listens on.*http://127\.0\.0\.1:PORT"):
        StarPOConfig(engine="vllm", engine_url="http://0.0.0.0:8000").validate()


@pytest.mark.parametrize("url", ["http://[::1", "http://:8000"])
def test_an_engine_url_without_a_host_says_what_is_accepted(url):
    with pytest.raises(ValueError, match=r"engine_url=.*expected an http\(s\) URL with a host"):
        StarPOConfig(engine="vllm", engine_url=url).validate()


@pytest.mark.parametrize("url", LOOPBACK_URLS)
def test_a_loopback_engine_url_is_accepted_without_a_warning(url):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        StarPOConfig(engine="vllm", engine_url=url).validate()


@pytest.mark.parametrize("url", ["http://192.168.1.5:8000", "http://gpu-node:8000", "http://[2001:db8::1]:8000"])
def test_allow_remote_engine_turns_the_refusal_into_a_warning(url):
    with pytest.warns(UserWarning, match=r"is another host \(allow_remote_engine is on\).*without authentication"):
        StarPOConfig(engine="vllm", engine_url=url, allow_remote_engine=True).validate()


def test_the_hf_engine_ignores_engine_url():
    """engine_url is unused by hf (nothing is contacted), so it is not checked there."""
    StarPOConfig(engine="hf", engine_url="http://192.168.1.5:8000").validate()


@pytest.fixture
def no_model_load(monkeypatch):
    import ragen_trainer.models

    def boom(*args, **kwargs):
        raise AssertionError("a model was loaded for a refused engine_url")

    monkeypatch.setattr(ragen_trainer.models, "load_model_and_tokenizer", boom)
    monkeypatch.setattr(ragen_trainer.models, "convert_default_model", boom)


def test_the_train_command_refuses_a_remote_engine_url_with_a_message(tmp_path, capsys, no_model_load):
    url = "http://192.168.1.5:8000"
    rc = cli.main(["train", "--engine", "vllm", "--engine_url", url, "--output_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert url in err and "--allow_remote_engine true" in err
    assert "Traceback" not in err


def test_the_train_command_takes_a_remote_engine_url_when_asked(tmp_path, capsys, no_model_load):
    argv = ["train", "--config", "configs/quick/bandit-smollm2-cpu.yaml", "--engine", "vllm", "--engine_url",
            "http://10.0.0.7:8000", "--allow_remote_engine", "true", "--output_dir", str(tmp_path / "run"),
            "--dry-run"]  # fmt: skip
    with pytest.warns(UserWarning, match="allow_remote_engine is on"):
        rc = cli.main(argv)
    assert rc == 0, capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ defaults in code
def test_servers_ragen_starts_or_reaches_default_to_loopback():
    assert webshop_parser().parse_args([]).host == "127.0.0.1"
    assert inspect.signature(make_server).parameters["host"].default == "127.0.0.1"
    assert inspect.signature(start_in_thread).parameters["host"].default == "127.0.0.1"
    # server mode without base_url: TRL's VLLMClient would default to 0.0.0.0; ragen passes 127.0.0.1
    assert inspect.signature(VLLMEngine).parameters["host"].default == "127.0.0.1"
    assert StarPOConfig().engine_url == "" and StarPOConfig().allow_remote_engine is False


# ------------------------------------------------------------------------------------------------ documented commands
#: Servers that listen on every interface unless told otherwise: each command must say --host 127.0.0.1.
OPEN_BY_DEFAULT = re.compile(r"\bvllm serve\b|\bvllm\.entrypoints\.(?:openai\.api_server|cli\.main)\b|"
                             r"\btrl vllm-serve\b")  # fmt: skip
#: Servers that bind loopback by default: a command may leave --host out, never name another address.
LOCAL_BY_DEFAULT = re.compile(r"\bwebshop-server\b|\bwebshop_server\.cli\b|\btransformers serve\b")
HOST_ARG = re.compile(r"--host[= ]+(\S+)")
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "'127.0.0.1'", '"127.0.0.1"'}
TEXT_SOURCES = ("README.md", "docs", "scripts", "examples")
PY_SOURCES = ("scripts", "examples", "benchmarks", "tests/vllm", "ragen_trainer/engines")


def _text_files() -> list[Path]:
    files: list[Path] = []
    for name in TEXT_SOURCES:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        else:
            files += sorted(p for p in path.rglob("*") if p.suffix in (".md", ".sh", ".txt", ".yaml", ".yml")
                            or (p.is_file() and p.suffix == "" and p.parent.name == "scripts"))  # fmt: skip
    return files


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Shell lines of a code block or script: comments dropped, backslash continuations joined."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if not pending and line.lstrip().startswith("#"):
            continue
        line = re.split(r"\s#\s", line, maxsplit=1)[0]  # a trailing comment
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def _commands(path: Path) -> list[tuple[str, str]]:
    """``(where, command)`` for every server command in a Markdown or shell file: in code blocks and scripts the
    logical line from the server's name on; in Markdown prose the inline code span (a bare name such as
    ```vllm serve``` is a mention, not a command)."""
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(ROOT)
    chunks: list[tuple[int, str]] = []
    if path.suffix == ".md":
        lines = text.splitlines()
        in_code, code, prose = False, [], []
        for number, line in enumerate(lines, 1):
            if line.lstrip().startswith("```"):
                if in_code:
                    chunks += [(start + n - 1, cmd) for n, cmd in _logical_lines("\n".join(code))]
                else:
                    start, code = number + 1, []
                in_code = not in_code
                continue
            if in_code:
                code.append(line)
            else:
                prose.append((number, line))
        joined = "\n".join(line for _, line in prose)
        numbers = [n for n, _ in prose]
        for match in re.finditer(r"`([^`]+)`", joined):
            chunks.append((numbers[joined.count("\n", 0, match.start())], match.group(1).replace("\n", " ")))
    else:
        chunks = _logical_lines(text)
    found = []
    for number, chunk in chunks:
        for pattern in (OPEN_BY_DEFAULT, LOCAL_BY_DEFAULT):
            match = pattern.search(chunk)
            if match is None:
                continue
            rest = chunk[match.end():].strip()
            if rest in ("", "...") or rest.split()[0] in ("--help", "-h"):
                continue  # a mention or a help call, not a server being started
            found.append((f"{rel}:{number}", chunk.strip()))
            break
    return found


def test_every_documented_server_command_binds_loopback():
    commands = [c for path in _text_files() for c in _commands(path)]
    open_ones = [(where, cmd) for where, cmd in commands if OPEN_BY_DEFAULT.search(cmd)]
    # the scan finds what it must (it cannot pass by finding nothing): docs/training.md's three vLLM servers
    assert sum(where.startswith("docs/training.md") for where, _ in open_ones) >= 3, open_ones
    bad = [f"{where}: {cmd}" for where, cmd in open_ones if HOST_ARG.search(cmd) is None
           or HOST_ARG.search(cmd).group(1) not in LOOPBACK_HOSTS]  # fmt: skip
    bad += [f"{where}: {cmd}" for where, cmd in commands
            if any(host not in LOOPBACK_HOSTS for host in HOST_ARG.findall(cmd))]  # fmt: skip
    assert not bad, "server commands that do not bind 127.0.0.1 (add --host 127.0.0.1):\n" + "\n".join(bad)


def _py_files() -> list[Path]:
    return sorted(p for name in PY_SOURCES for p in (ROOT / name).rglob("*.py"))


def _strings(node: ast.AST) -> list[str | None]:
    return [e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else None
            for e in getattr(node, "elts", [])]  # fmt: skip


def test_every_server_command_in_code_binds_loopback():
    """Command lists in the scripts, examples, benchmarks, the vLLM lane's tests and the engines: a vLLM server's
    has ``"--host", "127.0.0.1"``, and no ``--host`` names another address."""
    bad, vllm_commands = [], 0
    for path in _py_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and OPEN_BY_DEFAULT.search(node.value):
                rest = node.value[OPEN_BY_DEFAULT.search(node.value).end():].strip()
                if rest.startswith("--") and "--host 127.0.0.1" not in node.value:  # a shell command in a string
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}")
            if not isinstance(node, (ast.List, ast.Tuple)):
                continue
            items = _strings(node)
            hosts = [items[i + 1] for i, s in enumerate(items[:-1]) if s == "--host"]
            if any(h is not None and h not in LOOPBACK_HOSTS for h in hosts):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: --host {hosts}")
            if any(s and OPEN_BY_DEFAULT.fullmatch(s) for s in items):
                vllm_commands += 1
                if "127.0.0.1" not in hosts:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: a vLLM server without --host 127.0.0.1")
    assert vllm_commands >= 1  # tests/vllm/test_server.py's server
    assert not bad, "\n".join(bad)


def test_the_command_scan_tells_commands_from_mentions(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    doc = tmp_path / "a.md"
    doc.write_text("A plain `vllm serve` or `trl vllm-serve`; `webshop-server --help`.\n"
                   "Run `vllm serve model --port 1` or\n\n```bash\n# vllm serve in a comment\n"
                   "VLLM_SERVER_DEV_MODE=1 vllm serve m \\\n  --host 0.0.0.0 --port 8000\n"
                   "webshop-server --port 8000   # on http://127.0.0.1:8000\n```\n", encoding="utf-8")  # fmt: skip
    found = sorted(_commands(doc), key=lambda c: int(c[0].rsplit(":", 1)[1]))
    assert [where for where, _ in found] == ["a.md:2", "a.md:6", "a.md:8"], found
    assert "--host 0.0.0.0" in found[1][1]  # the continuation line joined
    assert found[2][1] == "webshop-server --port 8000"  # the trailing comment (an address in it) dropped


# ------------------------------------------------------------------------------------------------ weights folder
@pytest.fixture
def umask():
    """Set the process's umask for the test (``umask(0o077)``), restored after."""
    saved = os.umask(0o022)
    os.umask(saved)
    yield os.umask
    os.umask(saved)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _weights() -> list[tuple[str, object]]:
    return [("w", torch.ones(2, 2)), ("b", torch.zeros(2))]


@pytest.mark.parametrize("mask,folder_mode,file_mode", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600),
                                                        (0o002, 0o775, 0o664), (0o000, 0o775, 0o664)])  # fmt: skip
def test_the_weights_folder_follows_the_umask_and_is_never_world_writable(tmp_path, umask, mask, folder_mode,
                                                                          file_mode):
    umask(mask)
    folder = tmp_path / "run" / "vllm-weights"
    write_weights_for_reload(iter(_weights()), str(folder))
    assert _mode(folder) == folder_mode
    assert _mode(folder / WEIGHTS_FILE) == file_mode  # safetensors alone gives 0600
    assert folder.stat().st_uid == os.getuid()
    write_weights_for_reload(iter(_weights()), str(folder))  # the next push: same modes
    assert _mode(folder / WEIGHTS_FILE) == file_mode
    assert sorted(p.name for p in folder.iterdir()) == [WEIGHTS_FILE]


def test_an_own_world_writable_weights_folder_loses_that_bit(tmp_path, umask):
    umask(0o022)
    folder = tmp_path / "vllm-weights"
    folder.mkdir()
    folder.chmod(0o777)
    prepare_weights_dir(str(folder))
    assert _mode(folder) == 0o775


def _owned_by_someone_else(path: Path, monkeypatch) -> str:
    """Make ``path`` belong to another user: chown to nobody as root, else pretend to be another uid."""
    if os.getuid() == 0:
        os.chown(path, 65534, 65534, follow_symlinks=False)
        return "uid 65534" if not _has_user(65534) else "(uid 65534)"
    me = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: me + 1)
    return f"(uid {me})"


def _has_user(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def test_a_weights_folder_another_user_owns_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "vllm-weights"
    folder.mkdir()
    owner = _owned_by_someone_else(folder, monkeypatch)
    with pytest.raises(ValueError) as info:
        write_weights_for_reload(iter(_weights()), str(folder))
    message = str(info.value)
    assert str(folder) in message and owner in message and "belongs to" in message
    assert "--output_dir" in message  # what to do
    assert not (folder / WEIGHTS_FILE).exists()  # nothing written into it


def test_a_link_to_a_folder_another_user_owns_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("chown to another user needs root")
    target = tmp_path / "theirs"
    target.mkdir()
    os.chown(target, 65534, 65534)
    link = tmp_path / "vllm-weights"
    link.symlink_to(target)  # the link is ours, what it points to is not
    with pytest.raises(ValueError, match=r"vllm-weights belongs to .*uid 65534"):
        prepare_weights_dir(str(link))


def test_a_weights_path_that_is_not_a_folder_is_refused(tmp_path):
    path = tmp_path / "vllm-weights"
    path.write_text("not a folder")
    with pytest.raises(ValueError, match=r"vllm-weights is not a folder.*--output_dir"):
        prepare_weights_dir(str(path))
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="symbolic link to nothing"):
        prepare_weights_dir(str(dangling))


def test_the_weight_push_refuses_the_folder_before_calling_the_server(tmp_path, monkeypatch, tiny_tokenizer):
    """Through the engine (as the trainer pushes before each rollout): a ValueError, which ``ragen-trainer train``
    prints as its error (exit 2), and no request to the server."""
    posted: list[str] = []
    monkeypatch.setattr("ragen_trainer.engines.vllm.post_json", lambda url, *a, **k: posted.append(url))
    folder = tmp_path / "vllm-weights"
    folder.mkdir()
    _owned_by_someone_else(folder, monkeypatch)
    engine = VLLMEngine("tiny", tiny_tokenizer, mode="server", client=SimpleNamespace(base_url=""),
                        sampling_params_factory=dict, weights_dir=str(folder), weight_sync="reload")  # fmt: skip
    with pytest.raises(ValueError, match="belongs to"):
        engine.update_weights(torch.nn.Linear(2, 2))
    assert posted == []
