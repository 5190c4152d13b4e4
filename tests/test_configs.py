"""configs/ against the typed schemas: every position and model preset composes with `train` and builds a
working model, the YAML files hold only what differs from the dataclass defaults, and composing a config
is its check."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml
from conftest import REPO, TEST_CONFIGS, compose_config, compose_job
from omegaconf import OmegaConf, open_dict

from alibi_lm.cli import check_booleans, describe, sweep_cells
from alibi_lm.config import DataConfig, TokenizerConfig, autocast_dtype
from alibi_lm.errors import ConfigError, UserError
from alibi_lm.model import LMConfig, TransformerLM
from alibi_lm.positions import POSITION_SCHEMES

CONFIGS = REPO / "configs"
MODELS = sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml"))
TINY = ["model=tiny", "model.n_layer=1", "model.n_head=2", "model.d_model=16", "model.d_ff=32"]
TINY += ["model.adaptive_cutoffs=null"]  # vocab_size 100 is below any preset's cutoffs


def build(job, vocab_size: int) -> TransformerLM:
    return TransformerLM(dataclasses.replace(job.model, vocab_size=vocab_size))


def test_config_folders_match_the_registry():
    built_in = {n for n, cls in POSITION_SCHEMES.items() if cls.__module__.startswith("alibi_lm.positions.")}
    assert {p.stem for p in (CONFIGS / "position").glob("*.yaml")} == built_in
    assert {p.stem for p in (TEST_CONFIGS / "position").glob("*.yaml")} == set(POSITION_SCHEMES) - built_in
    assert {"paper", "small", "tiny"} <= set(MODELS)


def test_a_scheme_registered_again_under_its_name_composes_with_its_new_options(monkeypatch):
    """compose() stores each schema in Hydra's ConfigStore once, and again only when its class changed: a scheme
    registered again under its name (a notebook re-running its cell) composes with the Options it has now."""
    original = POSITION_SCHEMES["example"]

    @dataclasses.dataclass
    class WiderOptions(original.Options):
        width: int = 7

    class Wider(original):
        Options = WiderOptions

    assert type(compose_job("train", "position=example", *TINY).position) is original.Options
    monkeypatch.setitem(POSITION_SCHEMES, "example", Wider)
    job = compose_job("train", "position=example", *TINY)
    assert type(job.position) is WiderOptions and (job.position.width, job.position.scale) == (7, 0.5)
    monkeypatch.setitem(POSITION_SCHEMES, "example", original)
    assert type(compose_job("train", "position=example", *TINY).position) is original.Options


@pytest.mark.parametrize("position", list(POSITION_SCHEMES))
def test_position_config_builds_a_model(position):
    job = compose_job("train", f"position={position}", *TINY)
    assert job.model.position == position and type(job.position) is POSITION_SCHEMES[position].Options
    assert job.model.position_options == dataclasses.asdict(job.position)
    torch.manual_seed(0)
    model = build(job, vocab_size=100).eval()
    assert type(model.position) is POSITION_SCHEMES[position]
    with torch.no_grad():
        logits = model(torch.randint(0, 100, (2, 16)))
    assert logits.shape == (2, 16, 100) and torch.isfinite(logits).all()


def test_learned_max_len_follows_train_seq_len():
    job = compose_job("train", "position=learned", *TINY)
    assert job.model.position_options == {"max_len": job.train.seq_len}
    assert build(compose_job("train", "position=learned", "train.seq_len=48", *TINY), 100).position.max_positions == 48
    job = compose_job("train", "position=learned", "train.seq_len=48", "position.max_len=96", *TINY)
    assert build(job, 100).position.max_positions == 96


def test_position_options_reach_the_scheme():
    t5 = build(compose_job("train", "position=t5", "position.num_buckets=16", "position.max_distance=64", *TINY), 100)
    assert (t5.position.num_buckets, t5.position.max_distance, t5.position.bias_table.weight.shape[0]) == (16, 64, 16)
    assert build(compose_job("train", "position=rope", "position.base=500.0", *TINY), 100).position.base == 500.0
    assert build(compose_job("train", "position=example", *TINY), 100).position.options.scale == 0.5  # its YAML


@pytest.mark.parametrize("preset", MODELS)
def test_model_preset_composes_and_builds(preset):
    job = compose_job("train", f"model={preset}")
    with torch.device("meta"):  # shapes only: the paper model is 247M parameters
        model = build(job, vocab_size=267735)  # WikiText-103's word vocabulary fits every preset's cutoffs
    assert len(model.blocks) == job.model.n_layer
    if preset == "tiny":  # the CPU default, as it is: run it for real on a vocabulary its cutoffs fit
        vocab = max(job.model.adaptive_cutoffs) + 100
        torch.manual_seed(0)
        model = build(job, vocab_size=vocab).eval()
        idx = torch.randint(0, vocab, (1, 16))
        with torch.no_grad():
            assert torch.isfinite(model(idx[:, :-1], targets=idx[:, 1:])).all()
    if preset == "paper":
        assert abs(model.num_params() - 247e6) / 247e6 < 0.005
        assert job.model.adaptive_cutoffs == [20000, 60000]


def test_the_model_schema_is_lmconfig_itself():
    cfg = compose_config("train", "position=rope")
    assert list(cfg.model) == [f.name for f in dataclasses.fields(LMConfig)]  # a new field shows up by itself
    with open_dict(cfg):
        del cfg["hydra"]
    OmegaConf.resolve(cfg)  # as `--cfg job --resolve` does
    assert cfg.model.position == "rope" and cfg.model.position_options == {"base": 10000.0, "fraction": 1.0}


def yaml_files():
    """(YAML file, the schema it extends) for every config group option."""
    files = [(p, schema) for group, schema in (("model", LMConfig), ("data", DataConfig), ("tokenizer", TokenizerConfig))
             for p in sorted((CONFIGS / group).glob("*.yaml"))]
    for name, scheme in POSITION_SCHEMES.items():
        path = CONFIGS / "position" / f"{name}.yaml"
        files.append((path if path.is_file() else TEST_CONFIGS / "position" / f"{name}.yaml", scheme.Options))
    return files


@pytest.mark.parametrize("path, schema", yaml_files(), ids=lambda x: getattr(x, "stem", None))
def test_yaml_files_hold_only_what_differs_from_the_defaults(path, schema):
    defaults = {f.name: f.default for f in dataclasses.fields(schema) if f.default is not dataclasses.MISSING}
    for key, value in (yaml.safe_load(path.read_text()) or {}).items():
        assert key == "defaults" or key not in defaults or value != defaults[key], f"{path}: {key} = its default"


def test_experiment_paper_is_the_official_fairseq_command():
    job = compose_job("train", "experiment=paper")
    tc, m = job.train, job.model
    assert (job.name, job.seed, job.data.name, job.tokenizer.name) == ("paper", 1, "wikitext103", "word")
    assert (tc.seq_len, tc.batch_size, tc.grad_accum, tc.max_steps, tc.max_tokens) == (512, 18, 8, 286000, None)
    assert (tc.optimizer, tc.momentum, tc.weight_decay, tc.lr, tc.warmup_steps) == ("nag", 0.99, 0.0, 1.0, 16000)
    assert (tc.warmup_init_lr, tc.min_lr_ratio, tc.grad_clip) == (1e-7, 1e-4, 0.1)
    assert (m.n_layer, m.n_head, m.d_model, m.d_ff, m.activation, m.final_norm, m.init) == (
        16, 8, 1024, 4096, "relu", False, "fairseq")
    assert (m.dropout, m.attn_dropout, m.activation_dropout, m.adaptive_softmax_dropout) == (0.3, 0.1, 0.1, 0.2)
    assert (m.adaptive_cutoffs, m.adaptive_factor, m.embed_scale, m.position) == ([20000, 60000], 4, None, "alibi")
    assert job.eval.multipliers == [1, 2, 4, 8, 16]


@pytest.mark.parametrize("overrides, message", [
    (["train.seq_len=0"], "train.seq_len must be >= 1, got 0"),
    (["train.batch_size=-1"], r"train.batch_size must be >= 1, got -1"),
    (["train.max_steps=0"], "train.max_steps must be >= 1, got 0"),
    (["train.warmup_steps=-1"], "train.warmup_steps must be >= 0, got -1"),
    (["train.lr=0"], "train.lr must be > 0, got 0.0"),
    (["train.lr=inf"], "train.lr must be a finite number > 0, got inf"),
    (["train.lr=nan"], "train.lr must be a finite number > 0, got nan"),
    (["eval.multipliers=[1,inf]"], r"eval.multipliers must hold finite numbers >= 1, got \[1.0, inf\]"),
    (["eval.multipliers=[nan]"], r"eval.multipliers must hold finite numbers >= 1, got \[nan\]"),
    (["train.warmup_init_lr=inf"], "train.warmup_init_lr must be a finite number >= 0, got inf"),  # errors.check_range
    (["model.d_model=30", "model.n_head=4"], "model.d_model=30 is not divisible by model.n_head=4"),
    (["train.max_tokens=1000"], "set exactly one training budget.*add train.max_tokens=null"),
    (["train.optimizer=sgd"], "train.optimizer must be one of adamw, nag"),
    (["train.resume=maybe"], "train.resume must be one of true, false, auto"),
    (["train.precision=half"], "train.precision must be one of auto, bf16, fp32"),
    (["position=rope", "model.d_model=30", "model.n_head=2"], "rope needs an even head dimension"),
    (["position=learned", "position.max_len=8", "train.seq_len=16"],
     "position.max_len=8 rows are fewer than the 16 positions training gives; set position.max_len>=16"),
    (["position=example", "position.scale=0"], "position.scale must be > 0"),
    (["tokenizer=bpe", "tokenizer.vocab_size=100"], "tokenizer.vocab_size must be an integer >= 257"),
    (["eval.multipliers=[0.5]"], "eval.multipliers must hold finite numbers >= 1"),
    (["logger.wandb.mode=off"], "logger.wandb.mode must be"),
])
def test_composing_a_config_is_its_check(overrides, message):
    with pytest.raises(ConfigError, match=message) as error:
        compose_job("train", *overrides)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("overrides, message", [
    (["position=foo"], f"unknown position 'foo'; choose one of {', '.join(sorted(POSITION_SCHEMES))}"),
    (["train.seqlen=16"], "unknown config key 'train.seqlen' (misspelled?)"),
    (["train.seq_len=abc"], "train.seq_len: Value 'abc' of type 'str' could not be converted to Integer"),
])
def test_hydra_errors_in_one_line(overrides, message):
    with pytest.raises(Exception) as error:
        compose_config("train", *overrides)
    assert describe(error.value).startswith(message)


@pytest.mark.parametrize("device, precision, dtype", [
    ("cpu", "auto", None), ("cuda", "auto", torch.bfloat16), ("cuda:1", "auto", torch.bfloat16),
    ("cuda", "fp32", None), ("cpu", "bf16", torch.bfloat16), ("cpu", "fp32", None),
])
def test_precision_auto_is_bf16_on_cuda_and_float32_elsewhere(device, precision, dtype):
    assert autocast_dtype(device, precision) is dtype  # torch.device("cuda") needs no GPU
    with pytest.raises(ConfigError, match="precision must be one of auto, bf16, fp32"):
        autocast_dtype(device, "fp16")


def test_a_sweep_is_checked_cell_by_cell():
    cells = sweep_cells(["position=alibi,rope", "model.d_model=30,32", "seed=0"])
    assert sorted(cells) == sorted([f"position={p}", f"model.d_model={d}", "seed=0"] for p in ("alibi", "rope")
                                   for d in (30, 32))
    assert len(sweep_cells([f"seed={','.join(map(str, range(20)))}", "train.lr=0.1,0.2,0.3"])) == 60


def test_a_bad_cell_of_a_sweep_is_named_by_the_choices_it_sweeps():
    """-m position=alibi,fox position.gate_bias_init=3: the key is fox's, so the alibi cell fails; the line said
    "unknown config key" with no word of which cell, and its `+key` hint then fails in the fox cell."""
    import signal

    from alibi_lm.cli import cell_named, preflight, swept_values
    from alibi_lm.naming import custom_name
    from alibi_lm.stopping import Interrupted

    args = ["-m", "experiment=smoke", "position=alibi,fox", "position.gate_bias_init=3", "seed=0,1"]
    assert swept_values(args[1:], ["experiment=smoke", "position=fox", "position.gate_bias_init=3", "seed=1"]) == \
        ["position=fox", "seed=1"]
    for step in (lambda: custom_name(args, ()), lambda: preflight("train", args, lambda job, out: None)):
        with pytest.raises(UserError, match=r"^sweep cell position=alibi seed=0: unknown config key "
                                            r"'position.gate_bias_init' \(misspelled\?\)"):
            step()
    with pytest.raises(UserError) as refused:  # no `+key` hint: the fox cell has the key, and Hydra refuses adding it
        preflight("train", args, lambda job, out: None)
    assert "adds a new one" not in str(refused.value)
    stop = Interrupted("train stopped by Ctrl-C", signal.SIGINT)  # a signal while the cells are checked: as it is
    with pytest.raises(Interrupted) as stopped, cell_named("train", args[1:], ["position=alibi"], 4):
        raise stop
    assert stopped.value is stop and stopped.value.exit_status == 130
    with pytest.raises(Exception, match="^unknown config key|Could not override"):  # one cell: as before, no prefix
        preflight("train", ["position=alibi", "position.gate_bias_init=3"], lambda job, out: None)


@pytest.mark.parametrize("seq_len, threshold", [(128, 32.0), (2048, 512.0), (64, 16.0)])
def test_fire_threshold_starts_at_a_quarter_of_the_training_length(seq_len, threshold):
    """The FIRE paper's ratio (512 at L = 2048); position.init_threshold stays a setting of its own."""
    job = compose_job("train", "position=fire", f"train.seq_len={seq_len}")
    assert job.model.position_options["init_threshold"] == threshold
    assert compose_job("train", "position=fire", "position.init_threshold=512").model.position_options["init_threshold"] == 512


@pytest.mark.parametrize("override", ["train.progress=2", "train.progress=-1", "train.evaluate_after=7",
                                      "+task.reverse=2"])
def test_a_yes_no_setting_given_another_number_is_refused(override):
    overrides = [override] if "task" not in override else ["experiment=tasks", "task=copy", override.lstrip("+")]
    cfg = compose_config("train", *overrides)  # OmegaConf takes any integer for a bool
    key, _, text = override.lstrip("+").partition("=")
    with pytest.raises(UserError, match=rf"^{key} is a yes/no setting: set it to true or false, got {text}$"):
        check_booleans(cfg, overrides)
    for fine in ("true", "False", "1", "0", "yes", "off", "y", "'false'", "${train.compile}"):
        check_booleans(compose_config("train", *overrides[:-1], f"{key}={fine}"), [*overrides[:-1], f"{key}={fine}"])


def test_wandb_mode_follows_wandbs_own_variable(monkeypatch):
    from conftest import compose_job

    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert compose_job("train").logger.wandb.mode == "disabled"
    monkeypatch.delenv("WANDB_MODE")
    assert compose_job("train").logger.wandb.mode == "offline"
    assert compose_job("train", "logger.wandb.mode=online").logger.wandb.mode == "online"
