"""Study definitions: grid parsing, cell expansion, study files, cluster option parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from detr_peg.cli.main import main
from detr_peg.config.loader import load_config
from detr_peg.errors import ConfigError
from detr_peg.lab.study.cell import (
    CellPaths,
    cell_paths,
    eval_argv,
    first_difference,
    new_state,
    train_argv,
    write_state,
)
from detr_peg.lab.study.comparisons import ComparisonOptions, compare
from detr_peg.lab.study.grid import Axis, EvalPlan, StudyDefinition, expand_cells, parse_axis, run_order, split_values
from detr_peg.lab.study.runner import run_here
from detr_peg.lab.study.slurm import ClusterOptions, parse_mem, parse_time, plan_lines
from detr_peg.lab.study.study_file import load_study_file
from tests.conftest import REPO_ROOT
from tests.lab.study.conftest import write_base_config


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("sine,learned,none,peg", ["sine", "learned", "none", "peg"]),
        ("[0],[0,1,2]", ["[0]", "[0,1,2]"]),
        ("[[1, 2], [3]], 4", ["[[1, 2], [3]]", "4"]),
        ("{a: 1, b: 2},x", ["{a: 1, b: 2}", "x"]),
        ("'a,b',\"c,d\",e", ["'a,b'", '"c,d"', "e"]),
        ("1e-4,2e-4", ["1e-4", "2e-4"]),
        ("single", ["single"]),
    ],
)
def test_split_values_splits_on_commas_outside_brackets_and_quotes(text: str, values: list[str]) -> None:
    assert split_values(text) == values


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[0,1", "not closed"),
        ("0]", "closing bracket"),
        ("'a,b", "not closed"),
        ("a,,b", "empty value"),
        ("a,", "empty value"),
    ],
)
def test_split_values_refuses_malformed_lists(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        split_values(text)


def test_parse_axis_keeps_each_value_as_typed_and_refuses_bad_axes() -> None:
    assert parse_axis("model.position.peg_layers=[0],[0,1,2]") == Axis("model.position.peg_layers", ("[0]", "[0,1,2]"))
    assert parse_axis(" model.position.peg_kernel = 1,3,7") == Axis("model.position.peg_kernel", ("1", "3", "7"))
    for bad, message in (
        ("model.position.name", "KEY=V1,V2"),
        ("=a,b", "KEY=V1,V2"),
        ("k=", "KEY=V1,V2"),
        ("model.num_queries=10,10.0", "given twice"),
        ("k=[0],[0]", "given twice"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_axis(bad)


def test_cells_are_the_product_of_configs_axes_and_seeds_with_readable_unique_names() -> None:
    definition = StudyDefinition(
        configs=("a/detr.yaml", "b/deformable.yaml"),
        axes=(parse_axis("model.position.peg_layers=[0],[0,1,2]"), parse_axis("model.position.peg_kernel=3,7")),
        seeds=2,
        overrides=("model.position.name=peg", "train.max_iters=10"),
    )
    cells = expand_cells(definition)
    assert len(cells) == 2 * 2 * 2 * 2
    assert len({c.name for c in cells}) == len(cells)
    first = cells[0]
    assert first.name == "detr_position.peg_layers=0_position.peg_kernel=3_seed0"
    assert first.setting == "detr_position.peg_layers=0_position.peg_kernel=3"
    assert first.overrides == (
        "model.position.peg_layers=[0]",
        "model.position.peg_kernel=3",
        "model.position.name=peg",
        "train.max_iters=10",
        "train.seed=0",
    )
    assert cells[3].name == "detr_position.peg_layers=0_position.peg_kernel=7_seed1"
    assert cells[4].values == (("model.position.peg_layers", "[0,1,2]"), ("model.position.peg_kernel", "3"))
    assert cells[4].name.startswith("detr_position.peg_layers=0-1-2_")
    assert {c.config for c in cells[8:]} == {"b/deformable.yaml"}
    # The overrides are ordinary key=value overrides: a list value reaches the config as a list.
    cfg = load_config(None, cells[4].overrides)
    assert cfg.model.position.peg_layers == [0, 1, 2] and cfg.train.seed == 0


def test_single_config_without_axes_is_named_after_the_config() -> None:
    cells = expand_cells(StudyDefinition(configs=("configs/demo.yaml",), seeds=3))
    assert [c.name for c in cells] == ["demo_seed0", "demo_seed1", "demo_seed2"]
    assert {c.setting for c in cells} == {"demo"}


def test_expansion_refuses_conflicting_definitions() -> None:
    axis = parse_axis("model.position.name=sine,peg")
    with pytest.raises(ConfigError, match="given twice"):
        expand_cells(StudyDefinition(configs=("c.yaml",), axes=(axis, axis)))
    with pytest.raises(ConfigError, match="both a grid axis and a fixed override"):
        expand_cells(StudyDefinition(configs=("c.yaml",), axes=(axis,), overrides=("model.position.name=none",)))
    with pytest.raises(ConfigError, match="--seeds"):
        expand_cells(StudyDefinition(configs=("c.yaml",), overrides=("train.seed=3",)))
    # Where a cell trains is the study's: an axis over it would put every cell's run in the folders it names.
    with pytest.raises(
        ConfigError, match=r"^train.output_dir is set by the study \(each cell trains in cells/NAME/run"
    ):
        expand_cells(StudyDefinition(configs=("c.yaml",), axes=(parse_axis("train.output_dir=a,b"),)))
    with pytest.raises(ConfigError, match=r"^train.resume is set by the study"):
        expand_cells(StudyDefinition(configs=("c.yaml",), overrides=("train.resume=x.pth",)))


@pytest.mark.parametrize(
    ("configs", "grid", "message"),
    [
        (("a/c.yaml", "a/c.yaml"), None, "Two cells would share the folder a-c_seed0: a/c.yaml and a/c.yaml; "),
        (
            ("c.yaml",),
            "data.val_images=x/y,x y",
            "Two cells would share the folder val_images=x-y_seed0: c.yaml with data.val_images=x/y and "
            "c.yaml with data.val_images=x y; ",
        ),
        (
            ("c.yaml",),
            "data.val_images=" + "v" * 300,
            f"with data.val_images={'v' * 20}...{'v' * 20} (300 characters) would be the folder ",
        ),
    ],
    ids=["same-config-twice", "values-alike-as-names", "name-too-long"],
)
def test_every_cell_has_a_folder_of_its_own_that_the_file_system_accepts(configs, grid, message) -> None:
    axes = (parse_axis(grid),) if grid else ()
    with pytest.raises(ConfigError) as info:
        expand_cells(StudyDefinition(configs=configs, axes=axes))
    assert message in str(info.value)


def test_a_cell_name_of_255_bytes_is_accepted() -> None:
    cells = expand_cells(StudyDefinition(configs=("c.yaml",), axes=(parse_axis("data.val_images=" + "v" * 238),)))
    assert len(cells[0].name.encode()) == 255  # the longest name a file system accepts
    with pytest.raises(ConfigError, match="would be the folder"):
        expand_cells(StudyDefinition(configs=("c.yaml",), axes=(parse_axis("data.val_images=" + "v" * 239),)))


def test_a_grid_key_given_twice_on_the_command_line_is_refused(tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  arch: detr\n")
    grid = ["--grid", "model.position.name=sine", "--grid", "model.position.name=peg"]
    assert main(["study", "--config", str(config), *grid, "--output", str(tmp_path / "s"), "--plan"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "detr-peg study: error: --grid model.position.name is given twice; list all its values in one --grid."
    ]


def test_a_study_defined_in_code_with_a_key_on_two_axes_is_refused() -> None:
    axes = (parse_axis("model.position.name=sine"), parse_axis("model.position.name=peg"))
    with pytest.raises(ConfigError) as info:
        expand_cells(StudyDefinition(configs=("c.yaml",), axes=axes))
    assert str(info.value) == "--grid model.position.name is given twice; list all its values in one --grid."


def test_definition_round_trips_through_its_record() -> None:
    definition = StudyDefinition(
        configs=("c.yaml",),
        axes=(parse_axis("model.position.peg_layers=[0],[0,1]"),),
        seeds=3,
        overrides=("train.lr=1e-4",),
        eval=EvalPlan(scales=(1.0, 1.5), canvas_scales=(2.0,), padding=True),
    )
    assert StudyDefinition.from_dict(definition.to_dict()) == definition


def test_commands_of_a_cell() -> None:
    cell = expand_cells(StudyDefinition(configs=("c.yaml",), axes=(parse_axis("model.position.name=peg"),)))[0]
    paths = CellPaths(Path("/s/cells") / cell.name)
    assert train_argv(cell, paths) == [
        "train",
        "--config",
        "c.yaml",
        "--output",
        f"/s/cells/{cell.name}/run",
        "--resume",
        "model.position.name=peg",
        "train.seed=0",
    ]
    assert eval_argv(paths, EvalPlan()) is None  # the training's own last evaluation is enough
    assert eval_argv(paths, EvalPlan(scales=(1.0, 1.5), canvas_scales=(2.0,), padding=True)) == [
        "eval",
        "--checkpoint",
        f"/s/cells/{cell.name}/run/checkpoint.pth",
        "--output",
        f"/s/cells/{cell.name}/eval",
        "--scales",
        "1,1.5",
        "--canvas-scales",
        "2",
        "--padding",
    ]
    lines = plan_lines(Path("/s"), [cell], EvalPlan(scales=(2.0,)), ClusterOptions(nodes=2, gpus_per_node=4))
    assert lines[0].startswith("# one SLURM job per cell: 2 node(s) x 4 GPU(s)")
    assert lines[2].startswith("torchrun --nnodes=2 --nproc_per_node=4 -m detr_peg.cli.main train --config c.yaml")
    assert lines[3].endswith("--scales 2")


def test_first_difference_names_the_dotted_key() -> None:
    assert first_difference({"a": {"b": 1, "c": [0]}}, {"a": {"b": 1, "c": [0]}}) is None
    assert first_difference({"a": {"b": 1, "c": [0]}}, {"a": {"b": 1, "c": [0, 1]}}) == "a.c: [0] -> [0, 1]"


def test_paper_study_file_compares_each_detector_with_its_own_sine() -> None:
    file = load_study_file(REPO_ROOT / "configs" / "study" / "paper_coco.yaml")
    assert [Path(c).name for c in file.configs] == ["detr_r50_sine.yaml", "deformable_detr_r50_sine.yaml"]
    definition = StudyDefinition(
        configs=tuple(file.configs), axes=tuple(parse_axis(g) for g in file.grid), seeds=file.seeds or 1
    )
    cells = expand_cells(definition)
    assert [c.setting for c in cells] == [
        f"{stem}_position.name={name}"
        for stem in ("detr_r50_sine", "deformable_detr_r50_sine")
        for name in ("sine", "none", "peg")
    ]
    for cell in cells:
        cfg = load_config(cell.config, cell.overrides)
        assert cfg.model.position.name == dict(cell.values)["model.position.name"]
        if cfg.model.position.name == "peg":  # the paper's placement: one 3x3 PEG after the first encoder layer
            assert cfg.model.position.peg_layers == [0] and cfg.model.position.peg_kernel == 3
        assert cfg.train.epochs == 50 and cfg.train.total_batch_size == 32
    assert file.cluster["gpus_per_node"] * file.cluster.get("nodes", 1) * 4 == 32  # 4 images per GPU
    # Each detector's none and peg are paired with the same detector's sine, never with the other detector's.
    ap = {c.name: 30.0 + i for i, c in enumerate(cells)}
    results = {
        "definition": definition.to_dict(),
        "unit": "percent",
        "cells": [
            {
                "name": c.name,
                "setting": c.setting,
                "seed": c.seed,
                "config": c.config,
                "values": dict(c.values),
                "metrics": {"AP": ap[c.name]},
            }
            for c in cells
        ],
    }
    comparisons = compare(results, ComparisonOptions(baseline=file.comparison["baseline"]))
    pairs = {(r["setting"], r["reference"]): r["differences"] for r in comparisons["rows"]}
    expected = {}
    for stem in ("detr_r50_sine", "deformable_detr_r50_sine"):
        sine = f"{stem}_position.name=sine"
        for name in ("none", "peg"):
            setting = f"{stem}_position.name={name}"
            expected[(setting, sine)] = [ap[f"{setting}_seed0"] - ap[f"{sine}_seed0"]]
    assert pairs == expected


def test_study_file_grid_values_become_axes(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "configs: [a.yaml]\ngrid:\n  model.position.peg_layers: [[0], [0, 1, 2]]\n"
        "  model.position.name: [sine, peg]\nseeds: 2\neval: {scales: [1, 1.5]}\n"
    )
    file = load_study_file(path)
    assert file.configs == [str(tmp_path / "a.yaml")]
    assert [parse_axis(g) for g in file.grid] == [
        Axis("model.position.peg_layers", ("[0]", "[0,1,2]")),
        Axis("model.position.name", ("sine", "peg")),
    ]
    assert file.seeds == 2 and file.eval == {"scales": [1, 1.5]}
    path.write_text("configs: [a.yaml]\nseed: 2\n")
    with pytest.raises(ConfigError, match="unknown key 'seed'"):
        load_study_file(path)


def test_cluster_time_and_memory() -> None:
    assert [parse_time(t) for t in ("72:00:00", "90", "1:30", "2-00:00:00", "1-12")] == [4320, 90, 2, 2880, 2160]
    assert parse_mem("64G") == 64 and parse_mem("512M") == 0.5 and parse_mem("1T") == 1024
    for bad in ("soon", "0"):
        with pytest.raises(ConfigError, match="--time"):
            parse_time(bad)
    with pytest.raises(ConfigError, match="--mem"):
        parse_mem("lots")


def test_proxy_study_file_gives_both_architectures_with_four_encodings_and_seeds_until_decided() -> None:
    file = load_study_file(REPO_ROOT / "configs" / "study" / "proxy_synthetic.yaml")
    assert (file.seeds, file.target_ci, file.max_seeds) == ("auto", 1.0, 10)
    assert file.comparison == {"baseline": "model.position.name=sine", "equal_within": 2.0}
    # The first round of --seeds auto: 3 seeds per setting.
    definition = StudyDefinition(configs=tuple(file.configs), axes=tuple(parse_axis(g) for g in file.grid), seeds=3)
    cells = expand_cells(definition)
    assert len(cells) == 2 * 4 * 3
    assert cells[0].name == "deformable_small_position.name=sine_seed0"
    archs = {load_config(c.config, c.overrides).model.arch for c in cells}
    assert archs == {"detr", "deformable_detr"}
    assert file.eval == {"scales": [1.0, 1.5, 2.0], "canvas_scales": [1.5, 2.0], "padding": True}


def test_multiscale_proxy_study_trains_every_cell_at_several_sizes() -> None:
    file = load_study_file(REPO_ROOT / "configs" / "study" / "proxy_multiscale.yaml")
    definition = StudyDefinition(
        configs=tuple(file.configs),
        axes=tuple(parse_axis(g) for g in file.grid),
        seeds=3,  # the first round of seeds: auto
        overrides=tuple(file.overrides),
    )
    assert (file.seeds, file.target_ci, file.max_seeds) == ("auto", 1.0, 10)
    cells = expand_cells(definition)
    assert len(cells) == 2 * 4 * 3
    configs = [load_config(c.config, c.overrides) for c in cells]
    assert {c.model.position.name for c in configs} == {"sine", "learned", "none", "peg"}
    for cfg in configs:
        assert cfg.data.train_scales == [64, 72, 80, 88, 96, 104, 112, 120, 128] and cfg.data.train_max_size == 128
        assert cfg.data.val_scale == 96
        assert cfg.data.train_size_per == "batch"  # one size per batch: the token grid changes from step to step
        assert cfg.eval.extra_padding == 0.0  # evaluated one image at a time, as the models were trained
    budgets = {(c.model.arch, c.train.max_iters) for c in configs}
    assert budgets == {("detr", 4000), ("deformable_detr", 2750)}
    # 64 and 128 px lie inside the training range, 1.5x and 2x beyond it.
    assert file.eval == {"scales": [0.6667, 1.0, 1.3333, 1.5, 2.0], "canvas_scales": [1.5, 2.0], "padding": True}
    assert [round(96 * s) for s in file.eval["scales"]] == [64, 96, 128, 144, 192]


def test_a_study_file_grid_value_is_named_in_its_file(tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  arch: detr\n")
    study = tmp_path / "s.yaml"
    study.write_text(f"configs: [{config}]\ngrid:\n  model.position.name: [sine, sine]\n")
    assert main(["study", "--study", str(study), "--output", str(tmp_path / "out"), "--plan"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"detr-peg study: error: {study}: grid model.position.name: the value 'sine' is given twice."]


def test_the_seed_rule_of_a_study_file_goes_with_seeds_auto(tmp_path: Path) -> None:
    study = tmp_path / "s.yaml"
    for seeds, key in (("3", "target_ci: 0.5"), ("null", "max_seeds: 4"), ("3", "target_ci: 0.5\nmax_seeds: 4")):
        study.write_text(f"configs: [c.yaml]\nseeds: {seeds}\n{key}\n")
        with pytest.raises(ConfigError) as info:
            load_study_file(study)
        name = key.partition(":")[0]
        shown = "None" if seeds == "null" else seeds
        assert str(info.value) == f"{study}: '{name}' goes with 'seeds: auto' (seeds is {shown})."
    study.write_text("configs: [c.yaml]\nseeds: auto\ntarget_ci: 0.5\nmax_seeds: 4\n")
    assert (load_study_file(study).target_ci, load_study_file(study).max_seeds) == (0.5, 4)


def test_a_refused_value_from_a_study_file_or_plan_is_named_where_it_is_written(tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  arch: detr\n")
    study = tmp_path / "s.yaml"
    out = ["--output", str(tmp_path / "out"), "--plan"]
    study.write_text(f"configs: [{config}]\ngrid:\n  model.position.name: [sine, peg]\nbaseline: position.name=zzz\n")
    assert main(["study", "--study", str(study), *out]) == 2
    said = "position.name=zzz: 'zzz' is not a value of model.position.name; its values are sine, peg."
    assert capsys.readouterr().err.strip() == f"detr-peg study: error: {study}: baseline {said}"
    # The option, when given, is the one named.
    assert main(["study", "--study", str(study), "--baseline", "position.name=zzz", *out]) == 2
    assert capsys.readouterr().err.strip() == f"detr-peg study: error: --baseline {said}"
    study.write_text(f"configs: [{config}]\nseeds: auto\n")
    assert main(["study", "--study", str(study), *out]) == 2
    assert capsys.readouterr().err.strip() == (
        f"detr-peg study: error: {study}: seeds: auto needs two settings or more to compare "
        "(a --grid axis or several --config)."
    )


@pytest.mark.parametrize(
    ("where", "value", "said"),
    [
        ("grid", "train.lr: [abc, 2]", "{study}: grid: 'train.lr' must be a number, got 'abc'."),
        ("grid", "model.bogus: [1, 2]", "{study}: grid: unknown key 'model.bogus'; valid keys in model are: "),
        ("grid+scales", "train.lr: [abc, 2]", "{study}: grid: 'train.lr' must be a number, got 'abc'."),
        ("--grid", "train.lr=abc,2", "--grid: 'train.lr' must be a number, got 'abc'."),
        ("override", "train.bogus=1", "command line: unknown key 'train.bogus'; valid keys in train are: "),
        ("overrides", "train.bogus=1", "{study}: overrides: unknown key 'train.bogus'; valid keys in train are: "),
    ],
)
def test_a_refused_grid_value_is_named_where_it_was_given(
    tmp_path: Path, capsys, where: str, value: str, said: str
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  arch: detr\n")
    study = tmp_path / "s.yaml"
    in_file = {"grid": f"grid:\n  {value}\n", "overrides": f"overrides: [{value}]\n"}
    study.write_text(f"configs: [{config}]\n" + in_file.get(where.partition("+")[0], ""))
    extra = {"grid+scales": ["--scales", "1,1.5"], "--grid": ["--grid", value], "override": [value]}.get(where, [])
    assert main(["study", "--study", str(study), *extra, "--output", str(tmp_path / "s"), "--plan"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("detr-peg study: error: " + said.format(study=study)), err
    assert not (tmp_path / "s").exists()


def test_where_a_value_was_given_words_messages_only() -> None:
    """``sources`` names the place of a value (its key spelled with spaces too) and is left out of cell.json."""
    with pytest.raises(ConfigError, match=r"^s.yaml: grid: 'train.lr' must be a number, got 'abc'.$"):
        load_config(None, [" train.lr =abc"], sources={"train.lr ": "s.yaml: grid"})
    axis = parse_axis("train.lr=1e-4,2e-4", "s.yaml: grid")
    assert axis == parse_axis("train.lr=1e-4,2e-4")  # the source is not part of the definition
    cell = expand_cells(StudyDefinition(configs=("c.yaml",), axes=(axis,)))[0]
    assert cell.sources == (("train.lr", "s.yaml: grid"),)
    assert "sources" not in new_state(cell, {}) and new_state(cell, {})["values"] == [["train.lr", "1e-4"]]


def test_cells_run_seed_by_seed_in_the_plan_order_within_a_seed(tmp_path: Path) -> None:
    # A study cut off partway must hold whole seeds: the paired comparisons count only seeds both settings have.
    base = write_base_config(tmp_path / "base.yaml")
    definition = StudyDefinition(configs=(str(base),), axes=(parse_axis("model.position.name=sine,peg,none"),), seeds=3)
    cells = expand_cells(definition)
    assert [c.name for c in cells][:3] == [f"position.name=sine_seed{s}" for s in range(3)]  # the plan: setting-major
    study = tmp_path / "study"
    ran: list[str] = []

    def command(argv: list[str], log: Path) -> tuple[int, str | None]:
        ran.append(log.parent.name)
        return 0, None

    # Two cells already done are skipped wherever they fall; the others run seed by seed.
    for done in (cells[1], cells[3]):
        write_state(cell_paths(study, done), {**new_state(done, {}), "status": "done"})
    outcomes = run_here(study, definition, cells, command)
    expected = [f"position.name={n}_seed{s}" for s in range(3) for n in ("sine", "peg", "none")]
    assert ran == [name for name in expected if name not in (cells[1].name, cells[3].name)]
    assert sorted(o.name for o in outcomes if o.status == "done") == sorted(ran)
    assert sorted(o.name for o in outcomes if o.status == "skipped") == sorted([cells[1].name, cells[3].name])
    assert run_order(cells) == sorted(cells, key=lambda c: (c.seed, cells.index(c)))
