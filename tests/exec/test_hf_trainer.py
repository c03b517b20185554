"""fcp under transformers' Trainer and TRL's SFTTrainer equals the plain trainers in one process.

One spawn of 4 real gloo processes (the environment torchrun sets; accelerate joins the group)
runs every fcp case of `_hf_trainer_job`: `with_fcp(Trainer)` under DDP and under FSDP2
(transformers' `DistributedConfig`, the parameters checked sharded), three planted bugs,
the refusals only a distributed job can show, and `with_fcp(SFTTrainer)` on chats with an
assistant-only loss, uninterrupted and resumed mid-epoch from its step-3 checkpoint. Every
global batch runs degrees 3, 2 and 1 and replica 3 sits its second wave out.

The oracles are the plain Trainer and SFTTrainer in this process, on the same samples, one
optimizer step per global batch, each document its own padded row with sdpa; TRL tokenizes
and masks the chats itself. Compared: the logged loss and gradient norm of every step, every
parameter's total update, and TRL's per-token metrics, to 1e-5 relative. Plain SGD without
clipping makes every update lr x the gradient, so a wrong scale cannot hide.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from fcp_data.errors import ConfigError

from ._dist import run_distributed
from ._hf_trainer_job import (
    PLANTS,
    SFT_RESUME_AT,
    SFT_STEPS,
    STEPS,
    WORLD,
    _text_documents,
    build_data,
    fcp_documents,
    load_tokenizer,
    make_loader,
    reference_run,
    reference_samples,
    save_models,
    trainer_worker,
    training_args,
)

TOL = 1e-5
# (degree, is_placeholder) of every rank's two waves, every step (the plan of _fsdp_job)
WAVES = [[(3, False), (2, False)], [(3, False), (2, False)], [(3, False), (1, False)],
         [(1, False), (1, True)]]  # fmt: skip


def _rel(a: float | torch.Tensor, b: float | torch.Tensor) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def errors(got: dict[str, Any], ref: dict[str, Any], steps: int) -> dict[str, float]:
    """Worst relative errors against the oracle: per-step loss and grad norm (logged by the
    trainers), every parameter's update after `steps` (relative to the oracle's update)."""
    g_logs, r_logs = got["logs"][:steps], ref["logs"][:steps]
    assert [r["step"] for r in g_logs] == [r["step"] for r in r_logs] == list(range(1, steps + 1))
    start, r_end, g_end = ref["params"][0], ref["params"][steps], got["params"]
    assert set(g_end) == set(r_end)
    return {
        "loss": max(_rel(g["loss"], r["loss"]) for g, r in zip(g_logs, r_logs)),
        "grad_norm": max(_rel(g["grad_norm"], r["grad_norm"]) for g, r in zip(g_logs, r_logs)),
        "update": max(_rel(g_end[n] - start[n], r_end[n] - start[n]) for n in r_end),
    }


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, dict]:
    tmp = tmp_path_factory.mktemp("hf-trainer")
    data = build_data(tmp)
    models = save_models(tmp, data)
    run_distributed(
        trainer_worker, WORLD, json.dumps(data), json.dumps(models), str(tmp), timeout=420
    )
    return data, models, torch.load(tmp / "result.pt", weights_only=False)


@pytest.fixture(scope="module")
def oracles(job: tuple, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    data, models, _ = job
    tmp = tmp_path_factory.mktemp("hf-trainer-ref")
    runs = {"llama": ("llama", "text"), "qwen3": ("qwen3", "text"), "chat": ("llama", "chat")}
    out = {k: reference_run(data, models, m, c, tmp / k) for k, (m, c) in runs.items()}
    for ref in out.values():  # every parameter moved: an update error is never 0/0
        assert all(float((ref["params"][1][n] - p).norm()) > 0 for n, p in ref["params"][0].items())
    return out


def test_trainer_under_ddp_and_fsdp2_equals_the_plain_trainer(job: tuple, oracles: dict) -> None:
    data, _, res = job
    for key in ("t00", "t07", "t13"):  # the oracle's documents are the tokenizer's, not fcp's
        (doc,) = _text_documents(data, [key])
        assert fcp_documents(data, "text")[key][0] == doc
    worst = {}
    for case, ref in (("ddp", oracles["llama"]), ("fsdp", oracles["qwen3"])):
        got = res[case]
        assert got["seen"] == [w * STEPS for w in WAVES], (case, got["seen"])
        worst[case] = errors(got, ref, STEPS)
        assert max(worst[case].values()) <= TOL, (case, worst[case])
        for row, rec in zip(got["logs"], got["history"]):  # logged per step, per token
            assert row["fcp_degrees"] == "3,2,1" and row["fcp_waves"] == 2
            assert row["fcp_loss_tokens"] == rec["loss_tokens"] == rec["tokens"] - 7
            assert abs(row["loss"] - rec["loss"]) <= TOL * row["loss"]
    placements, local, full = res["fsdp"]["sharding"]
    assert placements == "(Shard(dim=0),)" and local * WORLD == full, res["fsdp"]["sharding"]
    print(f"worst relative errors vs the plain Trainer: {worst}")


def test_planted_bugs_fail_the_comparison(job: tuple, oracles: dict) -> None:
    _, _, res = job
    for plant in PLANTS:
        got = res[f"plant-{plant}"]
        assert got["seen"] == WAVES, plant  # the leak needs the degree-1 pack of two documents
        err = errors(got, oracles["llama"], 1)
        # the updates show every bug; the logged loss alone missed some (no positions: 2e-6)
        assert err["update"] > 1e-2, (plant, err)
    # the loss not scaled by the 4 processes DDP averages over: 4x too small, logged too
    scale = errors(res["plant-scale"], oracles["llama"], 1)
    assert abs(scale["grad_norm"] - 0.75) < 1e-4 and abs(scale["loss"] - 0.75) < 1e-4, scale


def test_sft_trainer_on_chats_and_a_mid_epoch_resume(job: tuple, oracles: dict) -> None:
    data, _, res = job
    ref = oracles["chat"]
    # TRL tokenized and masked the chats itself: the same ids and targets as fcp's loader
    assert ref["tokenized"] == {k: tuple(v) for k, v in fcp_documents(data, "chat").items()}
    got, resumed = res["sft"], res["sft-resumed"]
    assert got["seen"] == [w * SFT_STEPS for w in WAVES]
    assert resumed["seen"] == [w * (SFT_STEPS - SFT_RESUME_AT) for w in WAVES]
    worst = {"sft": errors(got, ref, SFT_STEPS), "resumed": errors(resumed, ref, SFT_STEPS)}
    assert max(worst["sft"].values()) <= TOL and max(worst["resumed"].values()) <= TOL, worst
    for name in ("entropy", "mean_token_accuracy", "num_tokens"):  # per token, every step
        want = [r[name] for r in ref["logs"]]
        for run in (got, resumed):
            have = [r[name] for r in run["logs"]]
            assert len(have) == SFT_STEPS, name
            assert all(abs(h - w) <= TOL * max(abs(w), 1) for h, w in zip(have, want)), name
    # two global batches an epoch: the resume at step 3 is mid-epoch, and the epoch goes on
    for run in (got, resumed):
        assert [r["epoch"] for r in run["logs"]] == [0.5, 1.0, 1.5, 2.0, 2.5]
    print(f"worst relative errors vs the plain SFTTrainer: {worst}")


def test_distributed_refusals(job: tuple) -> None:
    refusals = job[2]["refusals"]
    assert "is replica 1 of 4 but this process is 0 of 4" in refusals["replica"]
    assert "replica 0 of 2 but this process is 0 of 4" in refusals["world"]
    assert "sum gradients (divide factor 1" in refusals["fsdp_sum"]
    assert "4x too large" in refusals["fsdp_sum"]


def _trainer(tmp: Path, data: dict, models: dict, *, base: str = "trainer", attn: str = "fcp",
             loader: Any = None, **kw: Any) -> Any:  # fmt: skip
    """Build an fcp trainer in this process (1 replica); `kw` goes to the arguments."""
    import transformers

    from fcp_exec.hf import register_attention
    from fcp_exec.hf_trainer import with_fcp

    name = register_attention() if attn == "fcp" else attn
    model = transformers.AutoModelForCausalLM.from_pretrained(
        models["llama"], attn_implementation=name, dtype=torch.float32
    )
    extra = {k: kw.pop(k) for k in ("compute_loss_func",) if k in kw}
    loader = make_loader(data, "text", 1, 0) if loader is None else loader
    if base == "sft":
        import trl

        args = trl.SFTConfig(**training_args(tmp, 1), bf16=False, **kw)
        return with_fcp(trl.SFTTrainer)(model=model, args=args, fcp_loader=loader,
                                        processing_class=load_tokenizer(data), **extra)  # fmt: skip
    args = transformers.TrainingArguments(**training_args(tmp, 1), **kw)
    return with_fcp(transformers.Trainer)(model=model, args=args, fcp_loader=loader, **extra)


def test_settings_that_cannot_work_are_refused_by_name(job: tuple, tmp_path: Path) -> None:
    from accelerate import ParallelismConfig

    from fcp_data.loader import FCPDataLoader, LoaderOptions
    from fcp_data.planner import Cluster, CostModel
    from fcp_data.readers import LengthIndex

    data, models, _ = job
    cases = {
        "gradient_accumulation_steps=2": {"gradient_accumulation_steps": 2},
        "parallelism_config.cp_size=2": {"parallelism_config": ParallelismConfig(cp_size=2)},
        "label_smoothing_factor=0.1": {"label_smoothing_factor": 0.1},
        "eval_strategy='steps'": {"eval_strategy": "steps"},
        "compute_loss_func=": {"compute_loss_func": lambda *a, **k: 0},
        "attn_implementation='sdpa'": {"attn": "sdpa"},
    }
    for phrase, kw in cases.items():
        with pytest.raises(ConfigError, match=phrase.replace("(", r"\(").replace(".", r"\.")):
            _trainer(tmp_path / "t", data, models, **kw)
    for phrase, kw in {
        "padding_free=True": {"padding_free": True},
        "packing=True": {"packing": True},
        "loss_type='dft'": {"loss_type": "dft"},
        "assistant_only_loss=True but the loader trains chat roles": {
            "assistant_only_loss": True,
            "loader": make_loader(data, "chat", 1, 0, chat_loss_roles=("assistant", "tool")),
        },
    }.items():
        with pytest.raises(ConfigError, match=phrase):
            _trainer(tmp_path / "s", data, models, base="sft", **kw)
    import transformers

    args = transformers.TrainingArguments(**training_args(tmp_path / "d", 1))
    args.deepspeed = "ds_config.json"  # what a user's script sets (no DeepSpeed installed here)
    model = transformers.AutoModelForCausalLM.from_pretrained(models["llama"])
    from fcp_exec.hf_trainer import with_fcp

    with pytest.raises(ConfigError, match=r"deepspeed='ds_config\.json': DeepSpeed runs"):
        with_fcp(transformers.Trainer)(model=model, args=args,
                                       fcp_loader=make_loader(data, "text", 1, 0))  # fmt: skip
    empty = FCPDataLoader(
        LengthIndex.open(data["text"]), cluster=Cluster(1, tokens_per_replica=4096, idle="empty"),
        cost=CostModel.from_model("qwen3-1.7b", "cpu"), replica=0, global_batch_size=7,
        num_workers=0, tokenizer=load_tokenizer(data), options=LoaderOptions(eod_id=0),
    )  # fmt: skip
    with pytest.raises(ConfigError, match="idle='empty'"):
        _trainer(tmp_path / "e", data, models, loader=empty)
    # a checkpoint without fcp's loader state: refused before the first step
    trainer = _trainer(tmp_path / "r", data, models)
    (tmp_path / "plain-ckpt").mkdir()
    with pytest.raises(ConfigError, match=r"holds no fcp_loader\.json"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "plain-ckpt"))
    assert trainer.state.global_step == 0 and not trainer.fcp_history


def test_the_oracle_reads_fcp_samples_in_step_order(job: tuple) -> None:
    """The oracle's steps are fcp's global batches (its sampler alone decides them)."""
    data = job[0]
    batches = reference_samples(data, "text", STEPS)
    assert [len(b) for b in batches] == [7] * STEPS and len(set(batches[0] + batches[1])) == 14
