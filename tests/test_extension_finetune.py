"""Short fine-tunes at s L with one of RoPE's rescalings (train.finetune_scaling): the frequencies the fine-tune trains
with are the ones every later load gives it (training, resume, load_run, the evaluation), exactly
rope_frequencies(..., "linear", s); finetune.json records the rescaling; the rows name it; the refusals."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import compose_job, tokens

from alibi_lm.errors import ConfigError, UserError
from alibi_lm.positions.rope import rope_frequencies
from alibi_lm.training.trainer import Trainer

COMMON = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.adaptive_cutoffs=null", "data=wikitext2",
          "train.progress=false", "train.device=cpu", "train.eval_tokens=256", "train.warmup_steps=1",
          "logger.wandb.mode=disabled"]


def common(ws, position="rope") -> list[str]:
    return [*COMMON, f"data.root={ws}/data", f"paths.cache={ws}/cache", f"position={position}"]


@pytest.fixture(scope="module")
def rope_parent(ws):
    """A RoPE run trained at L = 16 for 16 steps (the parent of the fine-tunes here)."""
    parent = ws / "runs" / "ft" / "rope-L16-seed0"
    Trainer(compose_job("train", *common(ws), "train.seq_len=16", "train.batch_size=4", "train.max_steps=16",
                        "train.eval_every=16", "train.checkpoint_every=16"), parent).run()
    return parent


def finetune_job(ws, parent, *extra: str):
    return compose_job("train", *common(ws), "train.seq_len=64", "train.batch_size=2", "train.max_steps=null",
                       f"train.init_from={parent}", "train.finetune_fraction=0.25", "train.eval_every=100",
                       "train.checkpoint_every=100", *extra)


def linear_frequencies(model, s: float) -> torch.Tensor:
    """Position Interpolation's (Dh/2,) inverse frequencies for this model's RoPE at factor s (positions/rope.py)."""
    return rope_frequencies(model.position.head_dim, model.position.base, "linear", s, 16)[0]


def test_a_rope_finetune_with_pi_trains_and_loads_with_the_same_frequencies(ws, rope_parent):
    """The fine-tune's model divides RoPE's frequencies by s = 64 / 16 before its first step, after a resume and at
    every load; finetune.json records linear; its rows are rope+ft4x0.25-linear at the parent's L; load_run's model
    gives the trained model's logits bit for bit."""
    from alibi_lm.subjects import load_run, open_native

    child = ws / "runs" / "ft" / "rope-L16-seed0-ft4x0.25-linear"
    job = finetune_job(ws, rope_parent, "train.finetune_scaling=linear")
    first = Trainer(job, child)
    first.build()
    plain = rope_frequencies(first.model.position.head_dim, first.model.position.base)[0]
    assert torch.equal(first.model.position.inv_freq, linear_frequencies(first.model, 4.0))
    assert not torch.equal(first.model.position.inv_freq, plain)  # it does change the model
    record = json.loads((child / "finetune.json").read_text())
    assert (record["rescaling"], record["scale"], record["parent_train_len"]) == ("linear", 4.0, 16)
    # the parent's weights it starts from: the comparison refuses the fine-tune once the parent is trained again
    from alibi_lm.checkpoint import load_checkpoint
    from alibi_lm.plans.extension.runs import parent_trained_again
    from alibi_lm.provenance import weights_digest

    assert record["parent_weights"] == weights_digest(load_checkpoint(rope_parent / "checkpoint.pt")["model"])
    assert parent_trained_again(record, rope_parent) is None
    assert "fine-tuned from other weights of its parent" in parent_trained_again(
        dict(record, parent_weights="0123456789abcdef"), rope_parent)
    assert parent_trained_again({k: v for k, v in record.items() if k != "parent_weights"}, rope_parent) is None
    assert "is gone" in parent_trained_again(record, rope_parent.parent / "deleted")  # a new one would not be its own
    first.start()
    first.train_step()
    first.checkpoint()  # a killed run's last checkpoint: resumed below
    (child / "finetune.json").write_text(json.dumps(dict(record, parent_weights="0123456789abcdef")))
    with pytest.raises(UserError, match="was fine-tuned from other weights of .*delete"):  # a resume mixing two
        Trainer(finetune_job(ws, rope_parent, "train.finetune_scaling=linear", "train.resume=true"), child).build()
    (child / "finetune.json").write_text(json.dumps(record))
    resumed = Trainer(finetune_job(ws, rope_parent, "train.finetune_scaling=linear", "train.resume=true"), child)
    resumed.build()
    resumed.restore()
    assert resumed.step == 1 and torch.equal(resumed.model.position.inv_freq, linear_frequencies(resumed.model, 4.0))
    resumed.start()
    while resumed.step < resumed.steps:
        resumed.train_step()
    resumed.finish()
    model, _, _ = load_run(child)
    assert torch.equal(model.position.inv_freq, linear_frequencies(model, 4.0)) and model.finetune_scaling == "linear"
    idx = tokens(2, 48)
    resumed.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(idx), resumed.model(idx), rtol=0, atol=0)
    subject = open_native(child, ws / "results", torch.device("cpu"))
    assert (subject.identity["position"], subject.identity["train_len"]) == ("rope+ft4x0.25-linear", 16)
    with pytest.raises(UserError, match="train.resume|other settings"):  # a resume under another rescaling
        Trainer(finetune_job(ws, rope_parent, "train.finetune_scaling=yarn", "train.resume=true"), child).run()


def test_an_evaluation_refuses_a_rescaling_on_top_of_a_rescaled_finetune(ws, rope_parent):
    from alibi_lm.eval.evaluation import evaluate_run
    from alibi_lm.extension import OPTIONS

    child = ws / "runs" / "ft" / "rope-L16-seed0-ft4x0.25-ntk"
    Trainer(finetune_job(ws, rope_parent, "train.finetune_scaling=ntk"), child).run()
    ev = dict(split="valid", mode="nonoverlapping", multipliers=[1, 2], tokens_per_batch=256, max_tokens=256)
    for options in (OPTIONS["linear"](), OPTIONS["ntk"](factor=4.0)):
        with pytest.raises(UserError, match="fine-tuned with train.finetune_scaling=ntk") as e:
            evaluate_run(child, ev, ws / "results", device="cpu", progress=False, extension_cfg=options)
        assert "\n" not in str(e.value)
    rows = evaluate_run(child, ev, ws / "results", device="cpu", progress=False,
                        extension_cfg=OPTIONS["streaming"]())  # a remap composes with the fine-tune's frequencies
    assert {r["position"] for r in rows} == {"rope+ft4x0.25-ntk"} and {r["rope_scaling"] for r in rows} == {"streaming"}


def test_bad_finetune_scalings_are_one_line_errors(ws, rope_parent):
    with pytest.raises(ConfigError, match="add train.init_from"):
        compose_job("train", *common(ws), "train.finetune_scaling=linear")
    with pytest.raises(ConfigError, match="not position=alibi's"):
        compose_job("train", *common(ws, "alibi"), "train.seq_len=64", "train.max_steps=null",
                    f"train.init_from={rope_parent}", "train.finetune_fraction=0.25", "train.finetune_scaling=linear")
    with pytest.raises(ConfigError, match="must be one of linear, ntk, yarn, llama3"):
        finetune_job(ws, rope_parent, "train.finetune_scaling=dynamic")
    short = compose_job("train", *common(ws), "train.seq_len=8", "train.max_steps=null", f"train.init_from={rope_parent}",
                        "train.finetune_fraction=0.25", "train.finetune_scaling=linear")
    with pytest.raises(UserError, match="fine-tune at train.seq_len >= its L") as e:
        Trainer(short, ws / "runs" / "ft" / "short").build()
    assert "\n" not in str(e.value)


def test_refused_finetunes_write_nothing_into_their_folder(ws, rope_parent):
    """A parent of another model (another width, or a task run's vocabulary) is refused before finetune.json is
    written, so no later training of that folder is taken for a fine-tune; so are the run's own folder as its parent
    and a fraction that is no budget."""
    wider = ws / "runs" / "ft" / "wider"
    with pytest.raises(UserError, match="has another model config") as e:
        Trainer(finetune_job(ws, rope_parent, "model.d_model=64"), wider).run()
    assert "\n" not in str(e.value) and not (wider / "finetune.json").exists()
    with pytest.raises(UserError, match="is this run's own folder; a fine-tune trains into a folder of its own"):
        Trainer(finetune_job(ws, rope_parent), rope_parent).run()
    assert not (rope_parent / "finetune.json").exists()
    for fraction in ("inf", "nan", "0", "-1"):
        with pytest.raises(ConfigError, match=r"train.finetune_fraction must be (a finite number )?> 0, got"):
            finetune_job(ws, rope_parent, f"train.finetune_fraction={fraction}")
