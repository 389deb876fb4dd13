"""Hub folders of a trained detector: ``save_pretrained`` then ``from_pretrained`` round-trips exactly, no pickle.

The model is a tiny DETR trained for two iterations on synthetic shapes
(its run folder holds the ``metrics.json`` the model card reports). Only
local folders are used: the Hub itself is not reached (``push_to_hub`` runs
against a stand-in for ``huggingface_hub``'s ``HfApi``, and a Hub name is
tried in offline mode).
"""

from __future__ import annotations

import ast
import errno
import json
import os
from pathlib import Path

import huggingface_hub
import pytest
import torch
import yaml
from safetensors import safe_open

import detr_peg
from detr_peg.checkpoint.hub_folder import model_card
from detr_peg.cli.main import main
from detr_peg.config import config_to_dict
from detr_peg.data.padding import pad_images
from detr_peg.errors import CheckpointError, ConfigError, OutputError, UserError
from tests.data.conftest import assert_one_sentence
from tests.engine.tiny_run import synthetic_data, synthetic_overrides

FOLDER_FILES = {"config.json", "model.safetensors", "README.md"}
#: How a pickle starts (protocol 2 and later), and a ``torch.save`` zip archive.
PICKLE_STARTS = (b"\x80", b"PK\x03\x04")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The checkpoint of a tiny DETR trained for two iterations; ``metrics.json`` beside it."""
    root = tmp_path_factory.mktemp("hub")
    data = synthetic_data(root / "data")
    run = root / "run"
    assert main(["train", *synthetic_overrides(data, run, "train.max_iters=2", "train.batch_size=4")]) == 0
    assert (run / "metrics.json").is_file()
    return run / "checkpoint.pth"


def outputs(detector: detr_peg.Detector) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    images = [torch.randn(3, 60, 80, generator=generator), torch.randn(3, 90, 50, generator=generator)]
    batch, mask = pad_images(images, detector.model.size_divisibility)
    with torch.no_grad():
        return detector.model(batch, mask)


def test_save_then_load_gives_the_same_model_and_the_folder_holds_no_pickle(trained, tmp_path):
    detector = detr_peg.Detector.from_checkpoint(trained, device="cpu")
    folder = tmp_path / "hub"
    assert detector.save_pretrained(folder) is None
    assert {p.name for p in folder.iterdir() if not p.name.startswith(".detr-peg")} == FOLDER_FILES
    # The weights file starts with its header's length, whose first byte may be 0x80; safe_open parses it below.
    for path in folder.iterdir():
        if path.suffix != ".safetensors":
            assert not path.read_bytes().startswith(PICKLE_STARTS), path.name
    with safe_open(folder / "model.safetensors", "pt") as weights:
        assert set(weights.keys()) == set(detector.model.state_dict())

    again = detr_peg.Detector.from_pretrained(folder, device="cpu")
    assert again.config == detector.config and again.label_map == detector.label_map
    for key, value in detector.model.state_dict().items():
        assert torch.equal(again.model.state_dict()[key], value), key
    ours, theirs = outputs(detector), outputs(again)
    for name in ("pred_logits", "pred_boxes"):
        torch.testing.assert_close(theirs[name], ours[name], rtol=0, atol=0)

    # The weights file alone is a checkpoint for the command line and from_checkpoint, which name it for the folder.
    alone = detr_peg.Detector.from_checkpoint(folder / "model.safetensors", device="cpu")
    torch.testing.assert_close(outputs(alone)["pred_boxes"], ours["pred_boxes"], rtol=0, atol=0)
    for given, held in ((folder, folder / "model.safetensors"), (trained.parent, trained)):
        with pytest.raises(CheckpointError) as err:
            detr_peg.Detector.from_checkpoint(given, device="cpu")
        assert str(err.value) == f"The checkpoint file {given} is a folder; give the file it holds, {held}."


def test_the_model_card_states_the_model_its_metrics_and_training_config(trained, tmp_path):
    detector = detr_peg.Detector.from_checkpoint(trained, device="cpu")
    detector.save_pretrained(tmp_path / "hub")
    card = huggingface_hub.ModelCard.load(tmp_path / "hub" / "README.md")
    assert card.data.library_name == "detr_peg" and card.data.pipeline_tag == "object-detection"
    assert f'Detector.from_pretrained("{tmp_path / "hub"}")' in card.text
    ap = json.loads((trained.parent / "metrics.json").read_text())["bbox"]["AP"]
    assert f"| AP | {ap:.1f} |" in card.text
    config = yaml.safe_load(card.text.split("```yaml\n")[1].split("```")[0])
    assert config == config_to_dict(detector.config)
    assert (
        "4 categories (labels 0, 1, ... in category id order): 1: circle, 2: square, 3: triangle, 4: cross."
        in card.text
    )


def test_metrics_of_no_known_unit_are_refused_before_anything_is_written(trained, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained.parent, run)
    (run / "metrics.json").write_text(json.dumps({"bbox": {"AP": 12.5}, "unit": "permille"}))
    detector = detr_peg.Detector.from_checkpoint(run / "checkpoint.pth", device="cpu")
    with pytest.raises(CheckpointError, match=rf"^{run / 'metrics.json'} cannot be read as the run's metrics \(its"):
        detector.save_pretrained(tmp_path / "hub")
    assert not (tmp_path / "hub").exists()
    detector.save_pretrained(tmp_path / "hub", metrics={"AP": 1.25})  # given metrics: the file is not read
    assert "| AP | 1.2 |" in (tmp_path / "hub" / "README.md").read_text()


def test_push_to_hub_uploads_the_saved_folder(trained, monkeypatch):
    uploaded = {}

    class RecordingApi:  # stands in for huggingface_hub.HfApi: no network
        def __init__(self, token=None):
            pass

        def create_repo(self, repo_id, **kwargs):
            return type("RepoUrl", (), {"repo_id": repo_id})()

        def upload_folder(self, *, repo_id, folder_path, ignore_patterns=None, **kwargs):
            folder = Path(folder_path)
            names = huggingface_hub.utils.filter_repo_objects(
                [p.name for p in folder.iterdir()], ignore_patterns=ignore_patterns
            )  # what the real upload_folder sends
            uploaded.update(repo_id=repo_id, files=set(names))
            uploaded["card"] = (folder / "README.md").read_text()
            return "https://huggingface.co/owner/tiny-detr/commit/0"

    monkeypatch.setattr(huggingface_hub.hub_mixin, "HfApi", RecordingApi)
    detector = detr_peg.Detector.from_checkpoint(trained, device="cpu")
    assert detector.push_to_hub("owner/tiny-detr").endswith("/commit/0")
    assert uploaded["repo_id"] == "owner/tiny-detr" and uploaded["files"] == FOLDER_FILES
    assert 'Detector.from_pretrained("owner/tiny-detr")' in uploaded["card"]


def test_save_pretrained_replaces_only_what_it_wrote(trained, tmp_path):
    detector = detr_peg.Detector.from_checkpoint(trained, device="cpu")
    detector.save_pretrained(tmp_path / "hub")
    detector.save_pretrained(tmp_path / "hub")  # its own files: replaced
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"mine": true}')
    (mine / "README.md").write_text("my notes")  # kept, never refused: README.md is written only where absent
    with pytest.raises(UserError) as err:
        detector.save_pretrained(mine)
    assert_one_sentence(str(err.value), f"{mine / 'config.json'} exists and was not written by detr-peg")
    assert (mine / "config.json").read_text() == '{"mine": true}' and not (mine / "model.safetensors").exists()
    (mine / "config.json").unlink()
    detector.save_pretrained(mine)
    assert (mine / "README.md").read_text() == "my notes" and (mine / "model.safetensors").is_file()


def test_save_pretrained_on_a_full_disk_is_one_sentence(trained, tmp_path, monkeypatch):
    """The model card is written by huggingface_hub; its OSError is said as the folder's own files' are."""

    def full(card, path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(huggingface_hub.ModelCard, "save", full)
    with pytest.raises(OutputError) as err:
        detr_peg.Detector.from_checkpoint(trained, device="cpu").save_pretrained(tmp_path / "hub")
    assert_one_sentence(str(err.value), f"Could not write {tmp_path / 'hub' / 'README.md'}: No space left on device; "
                                        "free some space or choose a folder on another disk.")  # fmt: skip


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"{", "config.json"),
        ('{"a": "\u00e9"}'.encode("latin-1"), "UTF-8"),
        (b"[1]", "config.json"),
        (b"[" * 100000, "nested"),
    ],
)
def test_a_damaged_config_json_is_one_sentence(trained, tmp_path, content: bytes, words: str):
    folder = tmp_path / "hub"
    detr_peg.Detector.from_checkpoint(trained, device="cpu").save_pretrained(folder)
    (folder / "config.json").write_bytes(content)
    with pytest.raises(UserError) as err:
        detr_peg.Detector.from_pretrained(folder)
    assert_one_sentence(str(err.value), words)


def test_a_readme_that_is_a_dangling_link_is_refused_not_written_through(trained, tmp_path):
    folder, elsewhere = tmp_path / "hub", tmp_path / "elsewhere" / "NOTES.md"
    folder.mkdir()
    (folder / "README.md").symlink_to(elsewhere)
    with pytest.raises(UserError) as err:
        detr_peg.Detector.from_checkpoint(trained, device="cpu").save_pretrained(folder)
    assert_one_sentence(str(err.value), "README.md exists and was not written by detr-peg")
    assert not elsewhere.parent.exists() and not (folder / "config.json").exists()


def test_a_config_json_that_differs_from_the_weights_is_refused(trained, tmp_path):
    folder = tmp_path / "hub"
    detr_peg.Detector.from_checkpoint(trained, device="cpu").save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["config"]["model"]["num_queries"] += 1
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="differs from the one stored with model.safetensors"):
        detr_peg.Detector.from_pretrained(folder)


@pytest.mark.parametrize("version", [2, 0, "1", None, True])
def test_a_config_json_of_a_format_version_this_release_cannot_read_is_refused(trained, tmp_path, version):
    folder = tmp_path / "hub"
    detr_peg.Detector.from_checkpoint(trained, device="cpu").save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["format_version"] = version
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as err:
        detr_peg.Detector.from_pretrained(folder)
    assert_one_sentence(
        str(err.value), f"config.json has format_version {version!r}; this detr_peg reads versions 1 to 1"
    )


def test_a_hub_name_offline_and_not_cached_says_to_pass_a_local_folder(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    with pytest.raises(CheckpointError, match="owner/some-detr is not in the local Hugging Face cache") as error:
        detr_peg.Detector.from_pretrained("owner/some-detr")
    assert "pass its local path" in str(error.value) and "\n" not in str(error.value)
    # A mistyped local folder reads as a Hub name: the sentence says it is no local folder either.
    with pytest.raises(CheckpointError, match=r"^runs/hubb is not in the local .*, nor is it a local folder; check"):
        detr_peg.Detector.from_pretrained("runs/hubb")


def test_a_push_that_cannot_reach_the_hub_is_one_sentence(trained, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # a closed port: refused at once
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    detector = detr_peg.Detector.from_checkpoint(trained, device="cpu")
    with pytest.raises(CheckpointError, match=r"^Could not push to owner/x on the Hugging Face Hub \(.+\); check"):
        detector.push_to_hub("owner/x")


@pytest.mark.parametrize("metrics", ["x", 5, {"AP": "high"}, {"AP": float("nan")}, {"AP": True}, {1: 40.0}])
def test_save_pretrained_refuses_metrics_that_are_not_numbers(trained, tmp_path, metrics):
    detector = detr_peg.Detector.from_checkpoint(trained, device="cpu")
    with pytest.raises(ConfigError, match=r"^metrics must be a dict of metric names to finite numbers"):
        detector.save_pretrained(tmp_path / "out", metrics=metrics)
    assert list(tmp_path.iterdir()) == []


def test_building_a_detector_copies_nothing(trained):
    """ModelHubMixin would record the constructor's LoadedModel as config (a deep copy of the model); it must not."""
    loaded = detr_peg.load_model(trained)

    class Uncopyable(type(loaded.model)):
        def __deepcopy__(self, memo):
            raise AssertionError("the model was copied")

    loaded.model.__class__ = Uncopyable
    detector = detr_peg.Detector(loaded, device="cpu")
    assert detector.model is loaded.model


def test_the_model_card_shows_any_name_as_itself(trained) -> None:
    """Folder and category names reach the card as a valid Python literal and as plain Markdown text."""
    cfg = detr_peg.Detector.from_checkpoint(trained, device="cpu").config
    folder = 'hub "q"\\bs\\x\nline'
    names = ["<script>alert(1)</script>", "*star* #h", "a|b", "x\n## Metrics", "\x1b[31mred"]
    label_map = {"category_ids": [1, 2, 3, 4, 5], "names": names, "contiguous": True}
    text = model_card(cfg, label_map, None, folder).text
    code = text.split("```python\n")[1].split("```")[0]
    call = ast.parse(code).body[-2].value  # detector = detr_peg.Detector.from_pretrained(...)
    assert ast.literal_eval(call.args[0]) == folder
    classes = text.split("## Classes\n\n")[1].split("\n\n")[0]
    assert classes == (
        r"5 categories (labels 0, 1, ... in category id order): 1: &lt;script&gt;alert(1)&lt;/script&gt;, "
        r"2: \*star\* \#h, 3: a\|b, 4: x\\n\#\# Metrics, 5: \\x1b\[31mred."
    )
