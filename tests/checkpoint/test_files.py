"""The torch-free checks of the files a command names: local paths are checked, remote ones pass to their reader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from detr_peg.checkpoint.files import check_checkpoint_location, is_url
from detr_peg.convert.source_kind import check_source, is_transformers_source
from detr_peg.errors import CheckpointError


def test_urls_pass_and_local_paths_are_checked(tmp_path: Path) -> None:
    assert is_url("https://example.org/w.pth") and is_url("http://example.org/w.pth") and not is_url("w.pth")
    assert is_url("HTTPS://example.org/w.pth") and not is_url("a:b.pth")
    for other in ("file:///tmp/w.pth", "ftp://example.org/w.pth", "s3://bucket/w.pth"):
        scheme = other.split(":")[0]
        with pytest.raises(CheckpointError, match=rf"^{other}: detr-peg does not read {scheme}:// locations; give a"):
            check_checkpoint_location(other)
    assert check_checkpoint_location("https://example.invalid/no/such.pth") is None  # checked once downloaded
    weights = tmp_path / "w.pth"
    weights.write_bytes(b"not read")
    assert check_checkpoint_location(weights) is None
    with pytest.raises(CheckpointError, match=rf"^The backbone weights file {tmp_path}/x.pth does not exist\.$"):
        check_checkpoint_location(tmp_path / "x.pth", "backbone weights")
    with pytest.raises(CheckpointError, match=rf"^The checkpoint file {tmp_path} is a folder, not a file\.$"):
        check_checkpoint_location(tmp_path)


def test_convert_checks_an_official_file_and_leaves_folders_and_hub_names_to_their_reader(tmp_path: Path) -> None:
    assert is_transformers_source(tmp_path) and is_transformers_source("facebook/detr-resnet-50")
    assert not is_transformers_source(tmp_path / "detr.pth")
    for source in (tmp_path, "facebook/detr-resnet-50", "https://example.invalid/detr.pth"):
        assert check_source(source) is None
    with pytest.raises(CheckpointError, match=r"^The official checkpoint file no/such\.pth does not exist\.$"):
        check_source("no/such.pth")


def test_two_urls_ending_in_the_same_file_name_are_two_downloads(tmp_path: Path, monkeypatch) -> None:
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    import torch

    from detr_peg.checkpoint.files import read_checkpoint_file

    for name, value in (("a", 1.0), ("b", 2.0)):
        (tmp_path / "site" / name).mkdir(parents=True)
        torch.save({"w": torch.full((3,), value)}, tmp_path / "site" / name / "checkpoint.pth")
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "hub"))
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path / "site"))
    handler.log_message = lambda *args: None
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        for _ in range(2):  # the second round reads the cache
            for name, value in (("a", 1.0), ("b", 2.0)):
                state = read_checkpoint_file(f"{base}/{name}/checkpoint.pth")
                torch.testing.assert_close(state["w"], torch.full((3,), value))
    finally:
        server.shutdown()


def test_an_onnx_graph_given_as_a_checkpoint_names_its_readers(tmp_path: Path) -> None:
    from detr_peg.checkpoint.files import read_checkpoint_file

    (tmp_path / "m.onnx").write_bytes(b"\x08\x0a\x12\x07pytorch")  # how an exported graph begins
    with pytest.raises(CheckpointError, match=rf"^The checkpoint file {tmp_path}/m\.onnx is an ONNX graph: run it "
                       r"with predict --onnx or Detector\.from_onnx\.$"):  # fmt: skip
        read_checkpoint_file(tmp_path / "m.onnx")


class _Server:
    """A local web server whose answers a test sets per path: ``(status, headers, body, then_close)``."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.answers: dict[str, tuple] = {}
        answers = self.answers

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                self.do_GET()

            def do_GET(self) -> None:
                status, headers, body = answers.get(self.path.split("?")[0], (404, {"Content-Length": "0"}, b""))
                if status == "hang":
                    threading.Event().wait(body)
                    return
                if status == "garbage":
                    self.wfile.write(body)
                    return
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value.replace("PATH", self.path))
                self.end_headers()
                if self.command == "GET":
                    self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def server():
    serving = _Server()
    yield serving
    serving.server.shutdown()


def test_a_broken_download_keeps_nothing_and_the_next_try_downloads_again(tmp_path, monkeypatch, server) -> None:
    """A body cut short, a web page in place of the file, a server that never answers: one sentence each, nothing
    left in the cache, and the same URL works once the server serves the file."""
    import io

    import torch

    from detr_peg.checkpoint import files

    buffer = io.BytesIO()
    torch.save({"w": torch.arange(1000.0)}, buffer)
    good = buffer.getvalue()
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "hub"))
    monkeypatch.setattr(files, "DOWNLOAD_TIMEOUT", 1.0)
    cases = {
        "/short/w.pth": (
            (200, {"Content-Length": str(len(good))}, good[:1000]),
            r"the server sent 1000 of the \d+ bytes it announced\.$",
        ),
        "/page/w.pth": (
            (200, {"Content-Type": "text/html"}, b"<html>sign in</html>"),
            r"is not a PyTorch checkpoint: it begins",
        ),
        "/hang/w.pth": (("hang", {}, 5.0), r"timed out"),
        "/gone/w.pth": ((404, {"Content-Length": "0"}, b""), r"HTTP Error 404: Not Found"),
    }
    cached = lambda: sorted(p for p in (tmp_path / "hub").rglob("*") if p.is_file())  # noqa: E731
    for path, (answer, words) in cases.items():
        server.answers[path], before = answer, cached()
        with pytest.raises(CheckpointError) as refused:
            files.read_checkpoint_file(server.base + path)
        assert server.base + path in str(refused.value) and re.search(words, str(refused.value)), str(refused.value)
        assert "\n" not in str(refused.value)
        assert cached() == before, path
        server.answers[path] = (200, {"Content-Length": str(len(good))}, good)
        torch.testing.assert_close(files.read_checkpoint_file(server.base + path)["w"], torch.arange(1000.0))


@pytest.mark.parametrize(
    ("answer", "words"),
    [(("garbage", {}, b"garbage\r\n\r\n"), "Could not fetch a/x from the Hugging Face Hub (illegal status line"),
     ((302, {"Location": "PATH"}, b""), "Could not fetch a/x from the Hugging Face Hub (Exceeded 20 redirects"),
     ((404, {"Content-Length": "0"}, b""), "a/x is not in the local Hugging Face cache and could not be fetched from "
                                           "the Hub (Client error '404 Not Found'")],
    ids=["garbage", "redirect-loop", "not-found"],
)  # fmt: skip
def test_a_misbehaving_hub_is_one_sentence(tmp_path, server, answer, words) -> None:
    from tests.conftest import run_python

    server.answers["/a/x/resolve/main/config.json"] = answer
    code = "import detr_peg\ntry:\n    detr_peg.Detector.from_pretrained('a/x')\nexcept detr_peg.errors.CheckpointError as e:\n    print(e)"
    result = run_python("-c", code, HF_ENDPOINT=server.base, HF_HOME=str(tmp_path / "hf"), timeout=300)
    assert result.returncode == 0 and result.stdout.startswith(words), result.stdout + result.stderr
