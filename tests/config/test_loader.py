"""Config files compose, overrides apply, and mistakes are clear errors."""

from __future__ import annotations

import re

import pytest
import yaml

from detr_peg.config import config_to_dict, load_config, save_config
from detr_peg.config.loader import PAIRED_KEYS
from detr_peg.config.options import new_config
from detr_peg.errors import ConfigError


def write(path, data):
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def test_defaults_are_the_official_detr_values():
    cfg = load_config()
    assert cfg == new_config("detr", "sine")
    assert (cfg.model.arch, cfg.model.num_queries, cfg.model.transformer.dim_feedforward) == ("detr", 100, 2048)
    assert (cfg.loss.set_cost_class, cfg.loss.ce_loss_coef, cfg.loss.eos_coef) == (1.0, 1.0, 0.1)


def test_architecture_defaults_apply_under_files_and_overrides(tmp_path):
    cfg = load_config(None, ["model.arch=deformable_detr"])
    assert (cfg.model.num_queries, cfg.model.transformer.dim_feedforward, cfg.train.lr) == (300, 1024, 2e-4)
    assert (cfg.loss.set_cost_class, cfg.loss.ce_loss_coef) == (2.0, 2.0)
    f = write(tmp_path / "d.yaml", {"model": {"arch": "deformable_detr", "num_queries": 100}})
    cfg = load_config(f, ["train.lr=1e-4"])
    assert (cfg.model.num_queries, cfg.train.lr, cfg.model.transformer.dim_feedforward) == (100, 1e-4, 1024)


def test_base_files_compose_and_children_win(tmp_path):
    (tmp_path / "base").mkdir()
    write(
        tmp_path / "base" / "model.yaml",
        {"model": {"num_queries": 50, "position": {"name": "sine"}}, "train": {"epochs": 10}},
    )
    child = write(tmp_path / "exp.yaml", {"_base_": "base/model.yaml", "model": {"position": {"name": "peg"}}})
    cfg = load_config(child, ["train.epochs=3", "model.position.peg_layers=[0, 1]"])
    assert cfg.model.num_queries == 50
    assert cfg.model.position.name == "peg"
    assert cfg.model.position.peg_layers == [0, 1]
    assert cfg.train.epochs == 3


def test_a_parent_reached_twice_is_read_once(tmp_path):
    """A diamond: both parents change the grandparent; read again, it would undo the first parent's change."""
    write(tmp_path / "g.yaml", {"train": {"epochs": 1, "lr": 1e-5}, "model": {"num_queries": 7}})
    write(tmp_path / "b1.yaml", {"_base_": "g.yaml", "train": {"epochs": 2}})
    write(tmp_path / "b2.yaml", {"_base_": "g.yaml", "train": {"lr": 3e-4}})
    cfg = load_config(write(tmp_path / "c.yaml", {"_base_": ["b1.yaml", "b2.yaml"]}))
    assert (cfg.train.epochs, cfg.train.lr, cfg.model.num_queries) == (2, 3e-4, 7)


def test_values_are_coerced_and_checked():
    cfg = load_config(
        None, ["train.lr=1e-4", "train.epochs=12", "model.backbone.weights=null", "train.clip_max_norm=0"]
    )
    assert cfg.train.lr == 1e-4 and isinstance(cfg.train.lr, float)
    assert cfg.train.clip_max_norm == 0.0 and isinstance(cfg.train.clip_max_norm, float)
    # Scientific notation without a dot is a string to YAML 1.1; a whole number in it is an integer here too.
    cfg = load_config(None, ["data.val_scale=1e2", "train.max_iters=1.2e3", "data.train_scales=[1e2, 2e2]"])
    assert (cfg.data.val_scale, cfg.train.max_iters, cfg.data.train_scales) == (100, 1200, [100, 200])
    assert all(type(v) is int for v in (cfg.data.val_scale, cfg.train.max_iters, *cfg.data.train_scales))


@pytest.mark.parametrize(
    "override, fragments",
    [
        ("model.foo=1", ["command line", "unknown key 'model.foo'", "num_queries"]),
        ("train.lr=fast", ["'train.lr' must be a number", "'fast'"]),
        ("train.epochs=1.5", ["'train.epochs' must be an integer", "1.5"]),
        ("train.epochs=1.5e0", ["'train.epochs' must be an integer", "'1.5e0'"]),
        ("train.epochs=1e400", ["'train.epochs' must be an integer", "'1e400'"]),
        ("train.device=gpu", ["'train.device' must be auto, cpu, cuda or cuda:N, got 'gpu'"]),
        ("train.device=cuda:", ["'train.device' must be a string, got {'cuda': None}."]),  # YAML reads a mapping
        ("model.aux_loss=1", ["'model.aux_loss' must be true or false"]),
        ("model.backbone.norm=group", ["'model.backbone.norm' must be one of", "'frozen_bn'"]),
        ("data.train_scales=800", ["'data.train_scales' must be a list of an integer"]),
        ("model.transformer=3", ["'model.transformer' is a section"]),
        ("model.arch=yolo", ["unknown model.arch 'yolo'", "'deformable_detr'"]),
        ("nonsense", ["not of the form key=value"]),
        # What the user typed, with what YAML read it as.
        ("train.output_dir=~", ["'train.output_dir' must be a string, got '~' (read as None)."]),
        ("train.lr=", ["'train.lr' must be a number, got '' (read as None)."]),
        ("train.epochs=yes", ["'train.epochs' must be an integer, got 'yes' (read as True)."]),
        # Every image size has an upper bound, checked when the config is read.
        ("data.crop_scales=[1000000000]", ["'data.crop_scales' must be in [2, 8192], got [1000000000]."]),
        ("data.val_max_size=8193", ["'data.val_max_size' must be in [2, 8192], got 8193."]),
        ("data.train_max_size=100000", ["'data.train_max_size' must be in [2, 8192]"]),
        ("data.crop_size=[10,9000]", ["'data.crop_size' must be in [1, 8192]"]),
        # Numbers YAML 1.1 reads in another base than they look.
        ("model.num_queries=017", ["'model.num_queries' is 017, which YAML reads as 15 (a leading 0 is octal"]),
        ("train.seed=-010", ["'train.seed' is -010, which YAML reads as -8"]),
        ("train.lr=1:30.5", ["'train.lr' is 1:30.5, which YAML reads as 90.5", "':' is base 60"]),
        ("train.epochs=1:30", ["'train.epochs' is 1:30, which YAML reads as 90"]),
        ("train.max_iters=010", ["'train.max_iters' is 010, which YAML reads as 8"]),  # in a union too
        ("data.train_scales=[480,0512]", ["'data.train_scales' is 0512, which YAML reads as 330"]),  # in a list
    ],
)
def test_bad_overrides_name_the_key_and_value(override, fragments):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    for fragment in fragments:
        assert fragment in str(info.value)


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = write(tmp_path / "bad.yaml", "model: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: invalid YAML at line"):
        load_config(bad)
    wrong = write(tmp_path / "wrong.yaml", {"train": {"batchsize": 2}})
    with pytest.raises(ConfigError, match=r"wrong.yaml: unknown key 'train.batchsize'"):
        load_config(wrong)
    study = write(tmp_path / "study.yaml", {"configs": ["demo"], "grid": {"train.lr": [1e-4, 2e-4]}})
    with pytest.raises(ConfigError, match=r"study.yaml: unknown key '(configs|grid)' \(a study file's key: run it with "
                       r"detr-peg study --study\); valid keys in the top level are"):  # fmt: skip
        load_config(study)
    listing = write(tmp_path / "list.yaml", "- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping of sections"):
        load_config(listing)
    a = write(tmp_path / "a.yaml", {"_base_": "b.yaml"})
    write(tmp_path / "b.yaml", {"_base_": "a.yaml"})
    with pytest.raises(ConfigError, match="cycle"):
        load_config(a)
    sub = tmp_path / "sub"
    sub.mkdir()
    orphan = write(sub / "c.yaml", {"_base_": ["a.yaml", "gone.yaml"]})  # relative to c.yaml's folder: both missing
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(orphan))}: its _base_ 'a.yaml': Config file "
                       rf"{re.escape(str(sub / 'a.yaml'))} does not exist, and no shipped config has that name"):  # fmt: skip
        load_config(orphan)


@pytest.mark.parametrize("value", ["１", "٣", "０.５", "१e-4"])
def test_digits_of_other_scripts_are_no_number(value):
    """float() reads them; integer fields and options did not: now no field does."""
    with pytest.raises(ConfigError, match=rf"^command line: 'train.lr' must be a number, got '{value}'\.$"):
        load_config(None, [f"train.lr={value}"])


def test_saved_config_round_trips(tmp_path):
    cfg = load_config(None, ["model.arch=deformable_detr", "model.position.name=peg", "model.num_classes=7"])
    save_config(cfg, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again == cfg
    assert config_to_dict(again)["model"]["position"]["name"] == "peg"


@pytest.mark.parametrize("half", [0, 1])
@pytest.mark.parametrize("pair", list(PAIRED_KEYS), ids=lambda pair: pair[0])
def test_one_half_of_a_pair_of_keys_is_refused_naming_both(pair, half) -> None:
    given, missing = pair[half], pair[1 - half]
    message = rf"^{re.escape(given)} is set \(command line\) but {re.escape(missing)} is not \(defaults\); set both"
    with pytest.raises(ConfigError, match=message):
        load_config(None, [f"{given}=some/where"])
    both = load_config(None, [f"{given}=some/where", f"{missing}=other/place"])
    assert (getattr(both.data, given.split(".")[1]), getattr(both.data, missing.split(".")[1])) == (
        "some/where",
        "other/place",
    )


def test_a_number_in_octal_in_a_config_file_is_named(tmp_path):
    config = write(tmp_path / "c.yaml", "model:\n  num_queries: 017\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: 'model\.num_queries' is 017, which YAML reads as 15 \(a leading"):
        load_config(config)
    for same in ("17", "0x11", "1_7", "017.0", "0017.5e0"):  # what reads as it looks passes
        if "." in same:
            assert load_config(write(tmp_path / "d.yaml", f"train:\n  lr: {same}\n")).train.lr == float(same)
            continue
        assert load_config(write(tmp_path / "d.yaml", f"model:\n  num_queries: {same}\n")).model.num_queries == 17
    assert load_config(None, ["train.epochs=07", "train.seed=00"]).train.epochs == 7  # the same in octal
