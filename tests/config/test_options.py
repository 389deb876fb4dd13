"""Architectures and encodings own their config fields and defaults; every numeric field has its range."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from detr_peg.config import config_from_dict, config_to_dict, load_config
from detr_peg.config.loader import build_config, dotted_layer, parse_overrides
from detr_peg.config.options import ARCHITECTURE_SCHEMAS, ENCODING_OPTIONS, new_config, own_options, section_of
from detr_peg.config.ranges import Range
from detr_peg.config.schema import Config
from detr_peg.errors import ConfigError
from detr_peg.models.position import POSITION_ENCODINGS, PEGOptions
from detr_peg.models.registry import MODELS

ARCHS = MODELS.names()
ENCODINGS = POSITION_ENCODINGS.names()


def _own_keys(arch: str) -> list[str]:
    return list(own_options(load_config(None, [f"model.arch={arch}"])))


def _encoding_keys(encoding: str) -> list[str]:
    return [f"model.position.{f.name}" for f in dataclasses.fields(ENCODING_OPTIONS.get(encoding)) if f.name != "name"]


def test_model_arch_is_checked_against_the_model_registry():
    assert ARCHITECTURE_SCHEMAS.names() == ARCHS == ["deformable_detr", "detr"]
    with pytest.raises(ConfigError) as info:
        load_config(None, ["model.arch=yolo"])
    assert str(info.value) == "command line: unknown model.arch 'yolo': valid are 'deformable_detr', 'detr'."


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("other", ARCHS)
def test_a_field_of_another_architecture_names_the_key_and_the_architecture(arch, other):
    defaults = load_config(None, [f"model.arch={other}"])
    for key in _own_keys(other):
        section, _, name = key.rpartition(".")
        given = getattr(section_of(defaults, section), name)  # the other family's default: valid there
        override = f"{key}={str(given).lower() if isinstance(given, bool) else given}"
        if arch == other:
            load_config(None, [f"model.arch={arch}", override])
            continue
        with pytest.raises(ConfigError) as info:
            load_config(None, [f"model.arch={arch}", override])
        assert str(info.value) == (
            f"command line: '{key}' is an option of model.arch {other!r}, not of model.arch "
            f"{arch!r}; remove it or choose one of those."
        )


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_an_option_of_another_encoding_names_the_key_and_the_encoding(encoding):
    for other in ENCODINGS:
        for key in _encoding_keys(other):
            if other == encoding:
                continue
            with pytest.raises(
                ConfigError,
                match=rf"'{key}' is an option of model.position.name '{other}', not of "
                rf"model.position.name '{encoding}'",
            ):
                load_config(None, [f"model.position.name={encoding}", f"{key}=1"])
    cfg = load_config(None, [f"model.position.name={encoding}"])
    assert type(cfg.model.position) is ENCODING_OPTIONS.get(encoding)
    assert [f"model.position.{k}" for k in config_to_dict(cfg)["model"]["position"] if k != "name"] == _encoding_keys(
        encoding
    )


def test_architecture_defaults_apply_only_where_the_field_exists():
    assert load_config(None, ["model.arch=deformable_detr"]).model.position.offset == -0.5
    assert load_config(None, ["model.arch=detr"]).model.position.offset == 0.0
    peg = load_config(None, ["model.arch=deformable_detr", "model.position.name=peg"])
    assert not hasattr(peg.model.position, "offset")


def test_a_stored_config_of_an_earlier_layout_loads_without_the_fields_it_does_not_use():
    """A checkpoint's config holding every field of every family (as earlier versions wrote it)."""
    stored = config_to_dict(load_config(None, ["model.arch=deformable_detr", "model.num_classes=3"]))
    stored["model"]["transformer"]["pre_norm"] = False
    stored["model"]["position"].update(peg_layers=[0], peg_kernel=3, num_embeddings=50)
    stored["loss"]["eos_coef"] = 0.1
    cfg = config_from_dict(stored, source="config stored in old.pth")
    assert cfg == load_config(None, ["model.arch=deformable_detr", "model.num_classes=3"])
    switched = load_config(None, ["model.position.name=peg"], base=stored, base_source="old.pth")
    assert switched.model.position.peg_layers == [0] and switched.model.transformer.num_feature_levels == 4


def test_a_saved_config_round_trips_for_every_architecture_and_encoding():
    for arch in ARCHS:
        for encoding in ENCODINGS:
            cfg = load_config(None, [f"model.arch={arch}", f"model.position.name={encoding}"])
            assert type(cfg.model.position) is ENCODING_OPTIONS.get(encoding)
            assert config_from_dict(config_to_dict(cfg)) == cfg


def _numeric(hint) -> bool:
    args = typing.get_args(hint)
    return hint in (int, float) or any(_numeric(a) for a in args if a is not type(None))


def _sections(node, prefix=""):
    for f in dataclasses.fields(node):
        child = getattr(node, f.name)
        if dataclasses.is_dataclass(child):
            yield from _sections(child, f"{prefix}{f.name}.")
    yield prefix.rstrip("."), node


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_every_numeric_field_states_its_range(arch, encoding):
    missing = []
    for path, section in _sections(new_config(arch, encoding)):
        hints = typing.get_type_hints(type(section))
        for f in dataclasses.fields(section):
            if _numeric(hints[f.name]) and f.metadata.get("range") is None:
                missing.append(f"{path}.{f.name}")
    assert not missing


def test_ranges_describe_themselves():
    assert Range(1).describe() == "at least 1"
    assert Range(0, 1, high_open=True).describe() == "in [0, 1)"
    assert Range(0, low_open=True).describe() == "above 0"
    assert Range(0, 2**31 - 1).describe() == "in [0, 2147483647]"
    assert 0.5 in Range(0, 1) and 1 not in Range(0, 1, high_open=True) and 0 not in Range(0, low_open=True)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["model.transformer.enc_layers=1000000000"], "'model.transformer.enc_layers' must be in [0, 1000]"),
        (["model.transformer.hidden_dim=10000000"], "'model.transformer.hidden_dim' must be in [1, 16384]"),
        (["data.val_scale=10000000", "data.val_max_size=10000000"], "'data.val_scale' must be in [2, 8192]"),
        (
            ["model.arch=deformable_detr", "model.transformer.enc_n_points=100000000000"],
            "'model.transformer.enc_n_points' must be in [1, 256]",
        ),
    ],
)
def test_a_value_beyond_its_upper_bound_is_named_itself(overrides, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert fragment in str(info.value)


def test_large_but_possible_values_are_accepted():
    cfg = load_config(
        None,
        [
            "model.num_queries=2000",
            "model.transformer.hidden_dim=1024",
            "data.val_scale=1600",
            "data.val_max_size=2666",
            "train.batch_size=32",
        ],
    )
    assert cfg.model.num_queries == 2000


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_non_finite_floats_are_refused_everywhere(value):
    for path, section in _sections(Config()):
        hints = typing.get_type_hints(type(section))
        for f in dataclasses.fields(section):
            if hints[f.name] is float:
                with pytest.raises(ConfigError, match=rf"'{path}.{f.name}' must be a finite number"):
                    load_config(None, [f"{path}.{f.name}={value}"])


def test_layers_read_from_weights_keep_only_the_fields_of_the_chosen_encoding(caplog):
    """``convert``: tables of a learned encoding read from the weights, converted to ``peg``: left out silently
    from a lenient (stored) layer, with a note from any other earlier layer."""
    from_weights = dotted_layer({"model.position.name": "learned", "model.position.num_embeddings": 50}, "weights")
    choice = parse_overrides(["model.position.name=peg"])
    with caplog.at_level("INFO", logger="detr_peg.config.loader"):
        assert build_config([from_weights, choice], lenient={0}).model.position == PEGOptions()
        assert not caplog.records
        assert build_config([from_weights, choice]).model.position == PEGOptions()
    assert [r.getMessage() for r in caplog.records] == [
        "weights: left out 'model.position.num_embeddings', an option of another encoding than model.position.name "
        "'peg' (command line)"
    ]


@pytest.mark.parametrize("config", ["configs/detr_r50_peg.yaml", "configs/deformable_detr_r50_peg.yaml", "demo"])
def test_a_peg_config_runs_with_any_encoding(config, caplog) -> None:
    """The PEG options of a config file give way to a later model.position.name, with a note naming them."""
    for name in ("sine", "learned", "none"):
        caplog.clear()
        with caplog.at_level("INFO", logger="detr_peg.config.loader"):
            cfg = load_config(config, [f"model.position.name={name}"])
        assert cfg.model.position.name == name and not hasattr(cfg.model.position, "peg_layers")
        notes = [r.getMessage() for r in caplog.records]
        assert any("left out 'model.position.peg_layers'" in n and f"model.position.name '{name}'" in n for n in notes)
    # Given together with the other encoding, a PEG option is a contradiction: refused.
    with pytest.raises(ConfigError, match=r"'model.position.peg_layers' is an option of model.position.name 'peg'"):
        load_config(config, ["model.position.name=sine", "model.position.peg_layers=[1]"])


def test_a_study_over_encodings_plans_from_a_peg_config(tmp_path, capsys) -> None:
    from detr_peg.cli.main import main

    args = ["study", "--config", "configs/detr_r50_peg.yaml", "--grid", "model.position.name=sine,peg", "--plan"]
    assert main([*args, "--seeds", "3", "--output", str(tmp_path / "study")]) == 0
    out = capsys.readouterr().out
    assert "model.position.name=sine" in out and "model.position.name=peg" in out
    # The notes of the sine cells, each config read several times, are printed once.
    notes = [line for line in out.splitlines() if "left out 'model.position." in line]
    assert len(notes) == len(set(notes)) == 2, notes


def test_a_config_file_gives_way_to_a_later_architecture_with_a_note_per_key(caplog) -> None:
    """The demo's Deformable-DETR options under model.arch=detr: left out, each named, as an encoding's are."""
    with caplog.at_level("INFO", logger="detr_peg.config.loader"):
        cfg = load_config("demo", ["model.arch=detr"])
    assert cfg.model.arch == "detr" and not hasattr(cfg.model.transformer, "num_feature_levels")
    left_out = [r.getMessage().split(": ", 1)[1] for r in caplog.records if "left out" in r.getMessage()]
    assert left_out == [
        f"left out 'model.transformer.{key}', an option of another architecture than model.arch 'detr' (command line)"
        for key in ("num_feature_levels", "enc_n_points", "dec_n_points")
    ]
    with pytest.raises(ConfigError, match="'model.transformer.enc_n_points' is an option of model.arch"):
        load_config("demo", ["model.arch=detr", "model.transformer.enc_n_points=4"])  # given with the choice: refused
