"""The Trainer without Hydra: built from a TrainJob object, it trains, writes its run folder, and a run
stopped after a checkpoint resumes to the same weights, bit for bit."""

from __future__ import annotations

import contextlib
import gc
import json

import pytest
import torch
from conftest import needs_cxx, write_corpus
from omegaconf import OmegaConf

from alibi_lm import checkpoint as ckpt
from alibi_lm.config import DataConfig, LoggerConfig, PathsConfig, TokenizerConfig, TrainConfig, TrainJob, WandbConfig
from alibi_lm.errors import TrainingDiverged, UserError
from alibi_lm.model import LMConfig
from alibi_lm.provenance import cpu_description, git_commit
from alibi_lm.train import Trainer, check, train


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def job(tmp_path, corpus, **train) -> TrainJob:
    settings = dict(seq_len=16, batch_size=4, max_steps=8, warmup_steps=2, eval_tokens=256, eval_every=4,
                    checkpoint_every=4, progress=False)
    return TrainJob(
        name="direct", model=LMConfig(n_layer=1, n_head=2, d_model=32, d_ff=64, dropout=0.1, position="t5"),
        data=DataConfig("wikitext2", "wikitext-2", root=str(corpus), cache_dir=str(tmp_path / "cache")),
        tokenizer=TokenizerConfig("word"), train=TrainConfig(**{**settings, **train}),
        logger=LoggerConfig(WandbConfig(mode="disabled")), paths=PathsConfig(runs=str(tmp_path / "runs")),
    )


def killed_at_step_4(tmp_path, corpus, monkeypatch, run: str = "run", make_job=None) -> None:
    """Train job() (or make_job()) in tmp_path/run until the kill after its first checkpoint (step 4), as a kill
    between steps would."""
    step = Trainer.train_step

    def stop_after_the_first_checkpoint(self):
        if self.step == 4:
            raise KeyboardInterrupt
        step(self)

    monkeypatch.setattr(Trainer, "train_step", stop_after_the_first_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        Trainer((make_job or job)(tmp_path, corpus), tmp_path / run).run()
    monkeypatch.undo()


def test_a_trainer_runs_from_a_config_object(tmp_path, corpus):
    run = tmp_path / "run"
    result = Trainer(job(tmp_path, corpus), run).run()
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "completed" and status["step"] == 8 and result["val_ppl"] == status["val_ppl"]
    assert status["train_commits"] == [git_commit()]  # the code that trained it
    assert status["processes"] == 1  # under torchrun, the count that makes the global batch
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 9)) and [r["step"] for r in log if "val_ppl" in r] == [4, 8]
    state = ckpt.load_checkpoint(run)
    assert state["step"] == 8 and state["model_config"]["position"] == "t5"
    assert state["model_config"]["vocab_size"] == state["model"]["vocab.weight"].shape[0]  # the tokenizer's
    saved = OmegaConf.load(run / "config.yaml")  # the job as YAML: what evaluation and a resume read back
    assert saved.model.position == "t5" and saved.train.seq_len == 16 and saved.data.name == "wikitext2"


def test_a_run_trained_by_torchrun_is_not_reused_by_one_process(tmp_path, corpus):
    """A DDP run (two processes: twice the global batch) was skipped as trained by the same command without
    torchrun, and its rows then stood for a model that command does not train."""
    run = tmp_path / "run"
    Trainer(job(tmp_path, corpus), run).run()
    status = json.loads((run / "status.json").read_text())
    (run / "status.json").write_text(json.dumps(dict(status, processes=2)))  # as a run of two ranks records itself
    with pytest.raises(UserError, match=r"was trained by 2 process\(es\) \(torchrun: a global batch of 2 x "
                                        r"train.batch_size windows a step\) and this command runs 1: reusing it"):
        Trainer(job(tmp_path, corpus), run).run()
    (run / "status.json").write_text(json.dumps({k: v for k, v in status.items() if k != "processes"}))
    assert Trainer(job(tmp_path, corpus), run).run()["skipped"]  # a run recorded before the count: as before



def test_a_trained_run_named_by_its_settings_is_told_to_keep_its_name_to_train_further(tmp_path, corpus, capsys):
    """A larger train.max_steps changes the digest of a <experiment>-custom-<digest> name, so "add train.resume=true
    (with a larger train.max_steps)" alone looked for another folder with no checkpoint."""
    import dataclasses

    custom = dataclasses.replace(job(tmp_path, corpus), name="quick-custom-0123abcd")
    Trainer(custom, tmp_path / "run").run()
    capsys.readouterr()
    Trainer(custom, tmp_path / "run").run()
    assert "add train.resume=true and name=quick-custom-0123abcd (with a larger train.max_steps)" in capsys.readouterr().out


def test_a_stopped_run_resumes_to_the_same_weights(tmp_path, corpus, monkeypatch):
    Trainer(job(tmp_path, corpus), tmp_path / "ref").run()
    killed_at_step_4(tmp_path, corpus, monkeypatch)
    assert ckpt.load_checkpoint(tmp_path / "run")["step"] == 4
    stopped = ckpt.read_status(tmp_path / "run")
    assert stopped["train_commits"] == [git_commit()]
    assert [s["steps"] for s in stopped["train_segments"]] == [[0, 4]] and stopped["train_seconds"] > 0
    ckpt.write_status(tmp_path / "run", "running", step=4)  # as written before train_commits existed
    monkeypatch.setattr("alibi_lm.training.trainer.git_commit", lambda: "fffffff")  # resumed under newer code
    Trainer(job(tmp_path, corpus, resume=True), tmp_path / "run").run()
    status = ckpt.read_status(tmp_path / "run")
    assert status["train_commits"] == ["unrecorded", "fffffff"]
    unrecorded, resumed_segment = status["train_segments"]
    assert unrecorded == dict(commit="unrecorded", steps=[0, 4], seconds=None) and status["train_seconds"] is None
    assert resumed_segment["commit"] == "fffffff" and resumed_segment["steps"] == [4, 8]
    ref, resumed = ckpt.load_checkpoint(tmp_path / "ref"), ckpt.load_checkpoint(tmp_path / "run")
    assert resumed["step"] == 8 and ref["model"].keys() == resumed["model"].keys()
    for name, weight in ref["model"].items():
        assert torch.equal(weight, resumed["model"][name]), name
    assert log_records(tmp_path / "run") == log_records(tmp_path / "ref")  # every step once, the same losses


def test_a_resumed_run_keeps_the_threads_it_trained_with(tmp_path, corpus, monkeypatch):
    """Left to choose, a resume takes the checkpoint's CPU threads, not the free cores of the moment: another
    count splits the kernels' sums otherwise, and the weights would not match a run that was never stopped."""
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS")
    try:
        Trainer(job(tmp_path, corpus, threads=2), tmp_path / "ref").run()
        killed_at_step_4(tmp_path, corpus, monkeypatch, make_job=lambda *a: job(*a, threads=2))
        assert ckpt.load_checkpoint(tmp_path / "run")["cpu_threads"] == [2]  # each rank's
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # killed_at_step_4 undid the monkeypatch
        monkeypatch.setattr("alibi_lm.config.device.default_threads", lambda: (1, "1 CPU thread: the free cores"))
        resumed = Trainer(job(tmp_path, corpus, resume=True), tmp_path / "run")
        resumed.run()
        assert torch.get_num_threads() == 2 and resumed.threads_why.startswith("2 CPU thread(s): as the steps before")
        ref, run = ckpt.load_checkpoint(tmp_path / "ref"), ckpt.load_checkpoint(tmp_path / "run")
        assert all(torch.equal(weight, run["model"][name]) for name, weight in ref["model"].items())
        assert log_records(tmp_path / "run") == log_records(tmp_path / "ref")
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a setting of the user's wins over the checkpoint's
        torch.set_num_threads(1)
        again = Trainer(job(tmp_path, corpus, resume=True, max_steps=9), tmp_path / "run")
        again.run()
        assert torch.get_num_threads() == 1 and again.threads_why.endswith("OMP_NUM_THREADS")
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("fails", [False, True])
def test_no_training_model_outlives_the_process_group(tmp_path, corpus, monkeypatch, fails):
    """Under torchrun the model trained through DDP (Trainer.train_model, whose wrapper holds the process group) is
    freed before the group is destroyed, not in the interpreter's teardown, where gloo's threads can abort the
    process: after a run that finished well, and after one that failed, whose traceback keeps its Trainer."""
    at_destroy = []

    def destroy_process_group():
        at_destroy.extend(getattr(o, "train_model", None) for o in gc.get_objects() if type(o) is Trainer)

    step = Trainer.train_step

    def train_step(self):
        if fails and self.step == 2:
            raise UserError("a failing step")
        step(self)

    monkeypatch.setattr(Trainer, "train_step", train_step)
    monkeypatch.setattr("alibi_lm.train.setup_distributed", lambda device: (0, 1))
    monkeypatch.setattr("alibi_lm.train.dist.is_initialized", lambda: True)
    monkeypatch.setattr("alibi_lm.train.dist.destroy_process_group", destroy_process_group)
    gc.collect()
    gc.disable()  # the model must be let go whenever the automatic collection happens to run
    try:
        with pytest.raises(UserError) if fails else contextlib.nullcontext():
            train(job(tmp_path, corpus), tmp_path / "run")
    finally:
        gc.enable()
    assert at_destroy == ([None] if fails else [])  # a failed run's Trainer lives on in the traceback, without it


def log_records(run) -> list[dict]:
    """log.jsonl without the wall-clock field."""
    lines = (run / "log.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"} for line in lines]


def test_a_nan_loss_stops_the_run_and_keeps_the_last_checkpoint(tmp_path, corpus, monkeypatch):
    forward_backward = Trainer.forward_backward
    monkeypatch.setattr(Trainer, "forward_backward", lambda self: float("nan") if self.step == 5 else forward_backward(self))
    with pytest.raises(TrainingDiverged, match="loss is nan at step 6.*last good checkpoint .step 4. is kept") as error:
        Trainer(job(tmp_path, corpus), tmp_path / "run").run()
    assert error.value.exit_status == 3
    assert ckpt.read_status(tmp_path / "run")["status"] == "failed"
    assert ckpt.load_checkpoint(tmp_path / "run")["step"] == 4


def test_training_time_adds_up_over_resumed_segments(tmp_path, corpus, monkeypatch):
    killed_at_step_4(tmp_path, corpus, monkeypatch)
    first = ckpt.read_status(tmp_path / "run")["train_segments"]
    Trainer(job(tmp_path, corpus, resume=True), tmp_path / "run").run()
    status = ckpt.read_status(tmp_path / "run")
    segments = status["train_segments"]
    assert segments[0] == first[0] and [s["steps"] for s in segments] == [[0, 4], [4, 8]]
    assert all(s["commit"] == git_commit() and s["seconds"] > 0 for s in segments)
    assert all(s["device"] == f"cpu: {cpu_description()}, {torch.get_num_threads()} threads" for s in segments)
    assert status["train_seconds"] == pytest.approx(sum(s["seconds"] for s in segments), abs=0.002)


def test_a_resume_reads_the_checkpoint_to_the_cpu_whatever_the_device(tmp_path, corpus, monkeypatch):
    """The RNG states it restores must be CPU tensors (torch.set_rng_state, numpy's key): read to the training
    device, a CUDA run could not resume. test_cuda.py resumes one on a GPU."""
    killed_at_step_4(tmp_path, corpus, monkeypatch)
    read, asked = ckpt.load_checkpoint, []
    monkeypatch.setattr("alibi_lm.training.trainer.load_checkpoint", lambda path, map_location: asked.append(map_location) or
                        read(path, map_location))
    Trainer(job(tmp_path, corpus, resume=True), tmp_path / "run").run()
    assert asked == ["cpu"]


def test_a_resume_under_another_model_stops_without_the_cli(tmp_path, corpus, monkeypatch):
    killed_at_step_4(tmp_path, corpus, monkeypatch)
    other = job(tmp_path, corpus, resume=True)
    other.model = LMConfig(n_layer=1, n_head=2, d_model=64, d_ff=64, dropout=0.1, position="t5")
    # config.yaml edited by hand to the new model: the checkpoint's own model config decides, not config.yaml
    (tmp_path / "run" / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(other)))
    with pytest.raises(UserError, match=r"other settings \(model.d_model=32 there, 64 now; as its checkpoint.pt records\)"):
        Trainer(other, tmp_path / "run").run()
    (tmp_path / "run" / "config.yaml").unlink()  # gone: the settings check reads the checkpoint's copy
    with pytest.raises(UserError, match=r"other settings \(model.d_model=32 there, 64 now"):
        Trainer(other, tmp_path / "run").run()
    assert ckpt.load_checkpoint(tmp_path / "run")["step"] == 4  # nothing overwritten


def test_a_run_trains_and_validates_under_bf16_autocast_as_on_cuda(tmp_path, corpus):
    """On CUDA the Trainer steps and validates under bf16 autocast (train.precision=auto); train.precision=bf16
    takes the same mixed-dtype paths on the CPU, here with the adaptive input and softmax of every model preset.
    The run's evaluation computes as it trained unless precision= says otherwise, and rows say which."""
    from alibi_lm.eval.evaluation import evaluate_run

    runs = {}
    for precision in ("fp32", "bf16"):
        run = job(tmp_path, corpus, precision=precision)
        run.model.adaptive_cutoffs = [20, 60]
        runs[precision] = Trainer(run, tmp_path / precision).run()["val_ppl"]
        assert ckpt.read_status(tmp_path / precision)["status"] == "completed"
        segment = ckpt.read_status(tmp_path / precision)["train_segments"][-1]
        assert segment["device"].endswith(", bf16") == (precision == "bf16") and segment["precision"] == precision
    assert runs["bf16"] != runs["fp32"] and runs["bf16"] == pytest.approx(runs["fp32"], rel=0.05)  # rounding only
    scored = {}
    for precision in ("auto", "fp32"):  # auto: as the run trained, bf16
        (row,) = evaluate_run(tmp_path / "bf16", {"multipliers": [1], "max_tokens": 512}, tmp_path / precision,
                              device="cpu", progress=False, precision=precision)
        scored[precision] = row
    assert scored["auto"]["device"].endswith(", bf16") and not scored["fp32"]["device"].endswith(", bf16")
    assert scored["auto"]["ppl"] != scored["fp32"]["ppl"]
    assert scored["auto"]["ppl"] == pytest.approx(scored["fp32"]["ppl"], rel=0.05)


@pytest.mark.slow
@needs_cxx
def test_train_compile_trains_the_same_model(tmp_path, corpus):
    """train.compile=true (torch.compile of the model) trains as the eager model does, up to kernel rounding
    (without dropout, whose random numbers a compiled model draws differently)."""
    eager, compiled = job(tmp_path, corpus), job(tmp_path, corpus, compile=True)
    eager.model.dropout = compiled.model.dropout = 0.0
    want = Trainer(eager, tmp_path / "eager").run()["val_ppl"]
    assert Trainer(compiled, tmp_path / "compiled").run()["val_ppl"] == pytest.approx(want, rel=1e-4)


def test_a_schemes_learned_values_are_logged_and_recorded(tmp_path, corpus):
    """FIRE's threshold L_thr and c: in every validation record of log.jsonl and, final, in status.json."""
    import dataclasses

    fire = job(tmp_path, corpus)
    fire.model = dataclasses.replace(fire.model, position="fire", position_options={"init_threshold": 4.0})
    Trainer(fire, tmp_path / "run").run()
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    logged = [r["fire_threshold"] for r in log if "val_ppl" in r]
    assert len(logged) == 2 and all(r.keys().isdisjoint({"fire_threshold"}) for r in log if "val_ppl" not in r)
    status = ckpt.read_status(tmp_path / "run")
    state = ckpt.load_checkpoint(tmp_path / "run")
    multiplier = state["model"]["position.threshold_multiplier"]
    assert status["learned"]["fire_threshold"] == pytest.approx(float((multiplier * 4.0).abs())) == logged[-1]
    assert status["learned"]["fire_c"] == pytest.approx(float(state["model"]["position.c"].abs()))


def test_torchrun_with_more_processes_than_gpus_is_one_line(monkeypatch):
    from alibi_lm.config import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(UserError, match=r"^torchrun started 2 processes on this machine but 1 GPU\(s\) are visible; "
                       r"use --nproc_per_node=1 \(one process per GPU\) or train.device=cpu$"):
        resolve_device("auto", "train.device")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert resolve_device("auto", "train.device") == torch.device("cuda", 0)


def test_ddp_takes_nccl_on_cuda_and_gloo_with_train_device_cpu_on_a_gpu_machine(monkeypatch):
    from alibi_lm.training import distributed as train_module

    backends, devices = [], []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", devices.append)
    monkeypatch.setattr(train_module.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(train_module.dist, "init_process_group", backends.append)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert train_module.setup_distributed("cpu") == (0, 1)  # no group initialised here: rank 0 of 1
    train_module.setup_distributed("auto")
    assert backends == ["gloo", "nccl"] and devices == [torch.device("cuda", 1)]
    assert train_module.rng_state("cpu")["cuda"] is None  # no CUDA generator read for a run on the CPU
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match=r"^train.device=cuda:1 under torchrun would put every process on one GPU; "
                       r"use train.device=cuda"):
        train_module.setup_distributed("cuda:1")


def test_an_explicit_flex_with_heads_too_narrow_for_cuda_stops_before_any_work(monkeypatch):
    from conftest import compose_job

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    job = compose_job("train", "experiment=tasks", "task=passkey", "model.attention=flex", "model.n_head=16")  # no data read
    with pytest.raises(UserError, match=r"^model.attention=flex on CUDA needs heads at least 16 wide \(d_model / "
                       r"n_head = 8 here\); use model.attention=auto, or fewer heads$"):
        check(job, None)



def test_a_config_yaml_edited_after_training_does_not_make_the_run_another_commands(tmp_path, corpus):
    """config.yaml edited to another learning rate after training: a command with that rate is not this run (its
    checkpoint keeps the config it trained with), so it is neither skipped as trained nor resumed; refused in one line."""
    Trainer(job(tmp_path, corpus), tmp_path / "run").run()
    saved = OmegaConf.load(tmp_path / "run" / "config.yaml")
    saved.train.lr = 0.002
    OmegaConf.save(saved, tmp_path / "run" / "config.yaml")
    for resume, steps in (("auto", 8), (True, 10)):  # skipped as trained; trained further
        with pytest.raises(UserError, match=r"holds a run trained with other settings \(train.lr=0.001 there, 0.002 "
                                            r"now; as its checkpoint.pt records\)"):
            Trainer(job(tmp_path, corpus, lr=0.002, resume=resume, max_steps=steps), tmp_path / "run").run()
    assert ckpt.load_checkpoint(tmp_path / "run")["step"] == 8


def test_a_damaged_run_folder_file_is_one_line_and_nothing_is_lost(tmp_path, corpus, monkeypatch):
    """log.jsonl cut mid-line (a resume), tokenizer.json, config.yaml or finetune.json damaged (loading the run): each
    a UserError naming the file and the fix, the checkpoint as it was."""
    from alibi_lm.data import load_tokenizer
    from alibi_lm.subjects import load_run
    from alibi_lm.subjects.native import read_finetune_record

    killed_at_step_4(tmp_path, corpus, monkeypatch)
    run = tmp_path / "run"
    log = (run / "log.jsonl").read_text()
    (run / "log.jsonl").write_text(log[: len(log) // 2])  # cut inside a line
    with pytest.raises(UserError, match=r"log.jsonl, line \d+, is not a step's record; delete that line"):
        Trainer(job(tmp_path, corpus, resume=True), run).run()
    (run / "tokenizer.json").write_text("[1,2")
    with pytest.raises(UserError, match=r"tokenizer.json is damaged .*; delete it"):
        load_tokenizer(run / "tokenizer.json")
    (run / "config.yaml").write_text("name: [\n")
    with pytest.raises(UserError, match=r"config.yaml is not a readable config"):
        load_run(run)
    (run / "finetune.json").write_text("{")
    with pytest.raises(UserError, match=r"finetune.json is not readable \(JSONDecodeError\)"):
        read_finetune_record(run)
    assert ckpt.load_checkpoint(run)["step"] == 4
