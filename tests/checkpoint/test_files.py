"""The torch-free checks of the files a command names: local paths are checked, remote ones pass to their reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from detr_peg.checkpoint.files import check_checkpoint_location, is_url
from detr_peg.convert.source_kind import check_source, is_transformers_source
from detr_peg.errors import CheckpointError


def test_urls_pass_and_local_paths_are_checked(tmp_path: Path) -> None:
    assert is_url("https://example.org/w.pth") and is_url("http://example.org/w.pth") and not is_url("w.pth")
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
