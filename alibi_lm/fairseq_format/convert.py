"""A fairseq checkpoint and its dict.txt -> an ordinary alibi-lm run folder (config.yaml, checkpoint.pt,
tokenizer.json, status.json), which every app reads like a trained run.

The folder's data config is `tokenizer=fairseq` on the data set the model was trained on: the run's splits
are tokenized with fairseq-preprocess's dictionary of that training split (alibi_lm/fairseq_format/dictionary.py),
which must give the ids of the dict.txt passed in (else each word's rows are moved to its id here, within its
adaptive band). The weights are stored in float32 (the released files are float16): CPU evaluation runs in
float32, and CUDA evaluation casts under bf16 autocast as for every run. Everything is checked before anything
is written; the folder is built beside its destination and renamed into place, so a failed import leaves
nothing there.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import uuid
from pathlib import Path

import torch
from omegaconf import OmegaConf

from ..checkpoint import CHECKPOINT, STATUS
from ..config import CONFIG_DIR, DataConfig, TokenizerConfig, TrainConfig, TrainJob, typed
from ..data import prepare_data, sha256_file
from ..errors import UserError
from ..model import TransformerLM
from ..provenance import git_commit
from .checkpoint import num_updates, read_model, train_len, training_seed
from .dictionary import SPECIALS, read_dictionary, tokenizer_words


def data_config(name: str, root: str | None, cache_dir: str) -> DataConfig:
    """configs/data/<name>.yaml, with the data root (None: $ALIBI_LM_DATA at evaluation time, else ./data)."""
    path = Path(CONFIG_DIR) / "data" / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in path.parent.glob("*.yaml")))
        raise UserError(f"unknown data set {name!r}; pass --data <one of {known}> (the set the model was trained on)")
    values = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(path)).items() if k != "defaults"}
    return typed(DataConfig, {**values, "root": root, "cache_dir": cache_dir}, "data")


def vocabulary_order(project_words: list[str], fairseq_words: list[str], edges: list[int], dict_path: Path) -> list[int] | None:
    """For each id of the project's tokenizer, the fairseq id of the same word; None when they are the same ids.
    A word must stay in its adaptive band (bands are the model's structure); else the import is refused."""
    if project_words == fairseq_words:
        return None
    fairseq_id = {w: i for i, w in enumerate([*SPECIALS, *fairseq_words])}
    order = list(range(len(SPECIALS)))
    for pid, word in enumerate(project_words, len(SPECIALS)):
        fid = fairseq_id.get(word)
        band = sum(pid >= e for e in edges[1:-1])
        if fid is None or band != sum(fid >= e for e in edges[1:-1]) or len(project_words) != len(fairseq_words):
            where = "missing there" if fid is None else f"id {fid} there, in another adaptive band"
            raise UserError(f"{dict_path} does not fit the fairseq dictionary of the data's training split (the word "
                            f"{word!r} is id {pid} in the data's, {where}); pass --data <the set the model was trained "
                            f"on> and its dict.txt")
        order.append(fid)
    return order


def reorder_vocab(weights: dict, order: list[int], edges: list[int]) -> None:
    """Move each band's table rows to the project's ids (order: project id -> fairseq id, same band)."""
    index = torch.tensor(order)
    for i, (lo, hi) in enumerate(zip(edges, edges[1:])):
        weights[f"vocab.tables.{i}"] = weights[f"vocab.tables.{i}"][index[lo:hi] - lo]  # (V_i, D_i)


def build_import(checkpoint: Path, dict_path: Path, data: DataConfig, name: str) -> dict:
    """Everything the run folder holds, checked: the model loads its weights and the data gives its ids."""
    fairseq_words = read_dictionary(dict_path)
    state, args, cfg, weights, dtype = read_model(checkpoint, len(SPECIALS) + len(fairseq_words))
    job = TrainJob(name=name, seed=training_seed(state, args), model=cfg, data=data,
                   tokenizer=TokenizerConfig(name="fairseq"), train=TrainConfig(seq_len=train_len(state, args, checkpoint)))
    token_data = prepare_data(data, job.tokenizer)  # tokenizes the splits into the cache on first use
    edges = [0, *cfg.adaptive_cutoffs, cfg.vocab_size]
    order = vocabulary_order(tokenizer_words(token_data.tokenizer), fairseq_words, edges, dict_path)
    if order is not None:
        reorder_vocab(weights, order, edges)
    TransformerLM(cfg).load_state_dict(weights)  # strict: every parameter mapped, every shape right
    source = dict(path=str(Path(checkpoint).resolve()), sha256=sha256_file(checkpoint), dict=str(Path(dict_path).resolve()),
                  dict_sha256=sha256_file(dict_path), arch=args.get("arch"), dtype=dtype, stored_as="float32",
                  num_updates=num_updates(state), vocabulary="same ids" if order is None else "rows moved by word")
    checkpoint_state = {"model": weights, "model_config": dataclasses.asdict(cfg), "step": num_updates(state),
                        "config": dataclasses.asdict(job), "fairseq": source}
    return dict(job=job, data=token_data, state=checkpoint_state, source=source)


def default_out(runs: str, job: TrainJob) -> Path:
    """The folder a trained run of this name, scheme, L and seed would have."""
    return Path(runs) / job.name / f"{job.model.position}-L{job.train.seq_len}-seed{job.seed}"


RUN_FOLDER_FILES = (CHECKPOINT, STATUS, "config.yaml")  # what marks a folder as a run's


def check_replaceable(out: Path, force: bool) -> None:
    """`out` is free, or (with --force) a run folder or an empty one: --force replaces a run, never a file of the
    user's or a folder of runs (a runs tree passed as --out would go whole)."""
    if not out.exists():
        return
    if not force:
        raise UserError(f"{out} already exists; another checkpoint goes to --out <another folder> (--force replaces "
                        f"this one)")
    if not out.is_dir() or (any(out.iterdir()) and not any((out / name).is_file() for name in RUN_FOLDER_FILES)):
        what = "a file" if not out.is_dir() else "a folder that holds no checkpoint.pt, status.json or config.yaml"
        raise UserError(f"--out {out} is {what}; --force replaces only a run folder: pass --out <the run folder to "
                        f"write>, e.g. a new folder under --runs")


def write_run_folder(out: Path, built: dict, force: bool = False) -> Path:
    """Write the run folder in a temporary sibling and rename it to `out` (replacing it with force)."""
    out = Path(out)
    check_replaceable(out, force)
    tmp = out.parent / f".{out.name}.import-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir(parents=True)
        (tmp / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(built["job"])))
        built["data"].save_tokenizer(tmp / "tokenizer.json")
        torch.save(built["state"], tmp / CHECKPOINT)
        status = {"status": "completed", "step": built["state"]["step"], "imported_from": built["source"],
                  "import_commit": git_commit()}
        (tmp / STATUS).write_text(json.dumps(status, indent=2) + "\n")
        if out.exists():  # --force: the old folder goes only once the new one is complete
            old = out.parent / f".{out.name}.replaced-{uuid.uuid4().hex[:8]}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old)
        else:
            tmp.rename(out)
    except OSError as e:
        raise UserError(f"cannot write the run folder {out} ({e.strerror or e}); fix the permissions or pass --out "
                        f"<a writable folder>") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out
