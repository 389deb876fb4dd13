"""First runs: a short training, an empty prediction and boxes of a barely trained model each say why and what to
change; a long predict without a terminal logs its progress."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from detr_peg.engine.run_hints import low_ap_note, no_detections_note, short_training_note
from tests.conftest import TINY_DEMO, run_python, without_option

CLI = ("-m", "detr_peg.cli.main")


def test_the_notes_name_the_cause_and_the_settings_to_change() -> None:
    assert low_ap_note(45.0, 800) is None and low_ap_note(-1.0, 5) is None and low_ap_note(None, 5) is None
    note = low_ap_note(0.2, 50)
    assert note.startswith("Note: AP 0.2 % after 50 iterations is expected from so short a training")
    assert "train.max_iters" in note and "train.init_from" in note
    assert low_ap_note(0.2, 50, from_scratch=False) is None  # a fine-tune is not told to start from weights
    empty = no_detections_note(0.35, 50, "--score-threshold")
    assert "no detection scored at least 0.35" in empty and "lower --score-threshold" in empty
    assert "train.max_iters" in empty
    assert short_training_note(None) is None and short_training_note(50_000) is None
    assert "trained for 50 iterations only" in short_training_note(50)


def test_a_short_training_says_its_ap_is_expected(tiny_demo_dir: Path) -> None:
    stdout = (tiny_demo_dir / "stdout.txt").read_text().splitlines()
    ap = json.loads((tiny_demo_dir / "run" / "metrics.json").read_text())["bbox"]["AP"]
    assert ap < 1.0  # two iterations learn nothing
    done = next(i for i, line in enumerate(stdout) if line.startswith("Done: 2 iterations"))
    assert f"AP {ap:.1f} %" in stdout[done]
    assert stdout[done + 1].startswith(f"Note: AP {ap:.1f} % after 2 iterations is expected from so short a training")


def test_predict_with_nothing_above_the_threshold_says_why(tiny_demo_dir: Path, tmp_path: Path) -> None:
    checkpoint = tiny_demo_dir / "run" / "checkpoint.pth"
    image = sorted((tiny_demo_dir / "data" / "val").glob("*.png"))[0]
    args = (*CLI, "predict", "--checkpoint", str(checkpoint), str(image), "--device", "cpu")
    proc = run_python(*args, "--output", "none", "--score-threshold", "0.9", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-2].startswith("0 detections (score >= 0.9) in 1 images")
    assert lines[-1] == (
        "Note: no detection scored at least 0.9; a model after 2 training iterations that scores below that is "
        "expected when it is barely trained: lower --score-threshold (for example --score-threshold 0.05) to see "
        "its best guesses, or train longer (train.max_iters, or train.epochs with train.max_iters=null) or start "
        "from trained weights."
    )

    some = run_python(*args, "--output", "some", "--score-threshold", "0", cwd=tmp_path, timeout=300)
    assert some.returncode == 0, some.stderr[-2000:]
    assert (
        some.stdout.strip()
        .splitlines()[-1]
        .startswith(
            "Note: the checkpoint was trained for 2 iterations only; on real images its boxes are expected to miss"
        )
    )


def test_a_demo_that_draws_nothing_says_why(tmp_path: Path) -> None:
    proc = run_python(
        *CLI,
        "demo",
        "--output",
        "d",
        *without_option(TINY_DEMO, "--pictures"),
        "--pictures",
        "1",
        "--score-threshold",
        "1",
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert "0 detections (score >= 1) drawn on 1 pictures" in lines[-3]
    assert lines[-2].startswith("demo: AP50 ") and " % (AP " in lines[-2]
    assert lines[-1].startswith("Note: no detection scored at least 1; a model after 2 training iterations")
    assert "lower --score-threshold" in lines[-1]


def test_predict_without_a_terminal_logs_each_tenth_of_its_images(tiny_demo_dir: Path, tmp_path: Path) -> None:
    image = sorted((tiny_demo_dir / "data" / "val").glob("*.png"))[0]
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(105):
        shutil.copy(image, folder / f"{i:03d}.png")
    checkpoint = tiny_demo_dir / "run" / "checkpoint.pth"
    args = (*CLI, "predict", "--checkpoint", str(checkpoint), str(folder), "--output", "out", "--device", "cpu")
    proc = run_python(*args, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    logged = [line for line in proc.stdout.splitlines() if line.startswith("predict: ")]
    assert logged == [f"predict: {n} of 105 images" for n in (11, 21, 32, 42, 53, 63, 74, 84, 95, 105)]


def test_training_data_without_boxes_is_named(tmp_path: Path, caplog) -> None:
    import logging

    from detr_peg.engine.training import run_training
    from tests.engine.tiny_run import synthetic_data, synthetic_overrides, tiny_config

    data = synthetic_data(tmp_path / "data", num_train=4, num_val=2)
    annotations = json.loads(Path(data.train_annotations).read_text())
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({**annotations, "annotations": []}))
    caplog.set_level(logging.INFO, logger="detr_peg")
    cfg = tiny_config(
        synthetic_overrides(data, tmp_path / "run", "train.max_iters=1", f"data.train_annotations={empty}")
    )
    run_training(cfg, progress_bars=False)
    assert f"Note: {empty} holds no boxes; the run learns that the images hold no object." in caplog.text


def test_images_with_more_objects_than_queries_are_counted(tmp_path: Path, caplog) -> None:
    import logging
    from collections import Counter

    from detr_peg.engine.training import run_training
    from tests.engine.tiny_run import synthetic_data, synthetic_overrides, tiny_config

    data = synthetic_data(tmp_path / "data", num_train=6, num_val=2)
    per_image = Counter(a["image_id"] for a in json.loads(Path(data.train_annotations).read_text())["annotations"])
    queries = max(per_image.values()) - 1
    assert queries >= 1
    caplog.set_level(logging.INFO, logger="detr_peg")
    run_training(tiny_config(synthetic_overrides(data, tmp_path / "run", "train.max_iters=1",
                                                 f"model.num_queries={queries}")), progress_bars=False)  # fmt: skip
    over = sum(n > queries for n in per_image.values())
    assert (f"Note: {over} training images hold more objects than model.num_queries={queries} (up to "
            f"{queries + 1}); the others are never matched: raise model.num_queries.") in caplog.text  # fmt: skip
    caplog.clear()
    run_training(tiny_config(synthetic_overrides(data, tmp_path / "enough", "train.max_iters=1",
                                                 f"model.num_queries={queries + 1}")), progress_bars=False)  # fmt: skip
    assert "model.num_queries" not in caplog.text
