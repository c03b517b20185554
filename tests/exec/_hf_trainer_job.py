"""The Trainer / SFTTrainer parity job: fcp under transformers' and TRL's trainers vs one process.

Data: a real byte-level BPE (a transformers tokenizer with ChatML specials and a chat template
whose assistant turns are `{% generation %}` blocks), 14 text documents and 14 chats of distinct
token counts (a real tar and a JSON Lines file, indexed by `fcp index`'s code), global batches
of 7: two steps an epoch. Every global batch runs the explicit plan of `_fsdp_job` (found by
length rank): wave 0 is a degree-3 group and a degree-1 group of two documents, wave 1 a
degree-2 group and a degree-1 group, and replica 3 sits wave 1 out (a placeholder).

fcp side (4 real gloo processes, the environment torchrun sets): `with_fcp(Trainer)` under DDP
(`use_cpu=True, ddp_backend="gloo"`), the same under FSDP2 (transformers' `DistributedConfig`,
`from_pretrained`), three planted bugs (the loss not scaled by the world, documents of a pack
merged into one, no position ids), settings that must be refused, and `with_fcp(SFTTrainer)` on
the chats, uninterrupted and resumed from its step-2 checkpoint. Oracles (`reference_run`): the
plain Trainer / SFTTrainer in one process on the same samples, one optimizer step per global
batch, each document its own padded row (sdpa), TRL tokenizing the chats itself.

Plain SGD without clipping: every parameter's change is lr x its gradient, so a wrong loss
scale cannot hide behind Adam's normalisation or a clipped norm.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._fsdp_job import WAVES
from ._vlm_job import plan_of_waves

WORLD = 4
GLOBAL_BATCH = 7
STEPS = 3  # text runs: 1.5 epochs
SFT_STEPS = 5  # chat runs: 2.5 epochs, resumed after step 3 (mid-epoch)
SFT_RESUME_AT = 3
LR = 0.5
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>\n"
    "{% if loop.last %}{{ eos_token }}{% endif %}{% endgeneration %}"
    "{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
)
SENTENCE = (
    "the cat sits on the mat and looks at the camera while the long captions describe "
    "each clip of a red car that drives past a tall tree near the river"
)
WORDS = tuple(SENTENCE.split())
TEXT_WORDS = (3, 5, 8, 11, 14, 18, 23, 29, 37, 48, 62, 81, 105, 190)  # long-tailed
CHAT_TURNS = 14


def _text(n: int, shift: int) -> str:
    return " ".join(WORDS[(shift + k) % len(WORDS)] for k in range(n))


def chats() -> list[list[dict[str, str]]]:
    """14 conversations (system, user, assistant; every third one a second exchange)."""
    out = []
    for i in range(CHAT_TURNS):
        turns = [
            {"role": "system", "content": f"You are helper {i}."},
            {"role": "user", "content": _text(3 + 2 * i, i)},
            {"role": "assistant", "content": _text(4 + 5 * i, 2 * i)},
        ]
        if i % 3 == 0:
            turns += [
                {"role": "user", "content": "and then?"},
                {"role": "assistant", "content": _text(7 + 3 * i, i + 1)},
            ]
        out.append(turns)
    return out


def build_data(tmp: Path) -> dict[str, str]:
    """Tokenizer directory, text tar + index, chat JSON Lines + index, under tmp."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from webdataset import TarWriter

    from fcp_data.readers import build_index
    from fcp_data.readers.scan import ScanConfig

    corpus = [_text(40, s) for s in range(len(WORDS))] + ["helper You are and then?"] * 4
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<pad>"
    )
    tok.chat_template = CHAT_TEMPLATE
    tok_dir = tmp / "tokenizer"
    tok.save_pretrained(tok_dir)
    tok = PreTrainedTokenizerFast.from_pretrained(tok_dir)
    text_tar = tmp / "text.tar"
    with TarWriter(str(text_tar)) as w:
        for i, n in enumerate(TEXT_WORDS):
            w.write({"__key__": f"t{i:02d}", "txt": _text(n, i).encode()})
    build_index(str(text_tar), tmp / "text-index", counter=tok)
    chat_file = tmp / "chats.jsonl"
    chat_file.write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats()))
    cfg = ScanConfig(text_field="messages", tokenizer=str(tok_dir))
    build_index(str(chat_file), tmp / "chat-index", config=cfg)
    return {
        "tokenizer": str(tok_dir),
        "text": str(tmp / "text-index"),
        "chat": str(tmp / "chat-index"),
        "chat_file": str(chat_file),
    }


def load_tokenizer(data: dict[str, str]) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(data["tokenizer"])


def idle_planner(seqlens: Any, cluster: Any, cost: Any, *, causal: Any = True, **_: Any) -> Any:
    """`_fsdp_job`'s fixed plan on every global batch of 7: degrees 3 + 1, then 2 + 1 + idle."""
    return plan_of_waves(WAVES, GLOBAL_BATCH, seqlens, cluster, cost, causal=causal)


def make_loader(
    data: dict[str, str], corpus: str, replicas: int, replica: int, **options: Any
) -> Any:
    """This replica's loader of `corpus` ("text" or "chat"): the explicit plan on 4 replicas,
    one replica and the real planner for the oracle's samples; `options`: LoaderOptions."""
    from fcp_data.loader import FCPDataLoader, LoaderOptions
    from fcp_data.planner import Cluster, CostModel
    from fcp_data.readers import LengthIndex

    tok = load_tokenizer(data)
    options = LoaderOptions(
        eod_id=tok.eos_token_id,
        pad_id=tok.pad_token_id,
        text_field="messages" if corpus == "chat" else "text",
        planner=idle_planner if replicas > 1 else None,
        **options,
    )
    return FCPDataLoader(
        LengthIndex.open(data[corpus]),
        cluster=Cluster(replicas, tokens_per_replica=4096),
        cost=CostModel.from_model("qwen3-1.7b", "cpu"),
        replica=replica,
        global_batch_size=GLOBAL_BATCH,
        num_workers=0,
        tokenizer=tok,
        options=options,
    )


def make_model(kind: str, vocab: int, attn: str = "sdpa", seed: int = 0) -> Any:
    import transformers

    torch.manual_seed(seed)
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }[kind]
    cfg = config_cls(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, vocab_size=vocab, max_position_embeddings=4096,
        bos_token_id=0, eos_token_id=0, pad_token_id=0, tie_word_embeddings=False,
    )  # fmt: skip
    cfg._attn_implementation = attn
    return model_cls(cfg).float()


def save_models(tmp: Path, data: dict[str, str]) -> dict[str, str]:
    """Random tiny Llama and Qwen3, saved with save_pretrained so both sides load the same."""
    vocab = -(-len(load_tokenizer(data)) // 32) * 32
    out = {}
    for k, kind in enumerate(("llama", "qwen3")):
        path = tmp / f"model-{kind}"
        make_model(kind, vocab, seed=5 + k).save_pretrained(path)
        out[kind] = str(path)
    return out


def training_args(out: Path, steps: int, **kw: Any) -> dict[str, Any]:
    """Both sides' TrainingArguments: CPU, SGD at a constant rate, no clipping, log every step."""
    return {
        "output_dir": str(out),
        "use_cpu": True,
        "max_steps": steps,
        "learning_rate": LR,
        "optim": "sgd",
        "lr_scheduler_type": "constant",
        "max_grad_norm": 0.0,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "disable_tqdm": True,
        "seed": 0,
        "dataloader_num_workers": 0,
        **kw,
    }


class ParamHistory:
    """Trainer callback factory: every parameter after every step (gathered if sharded)."""

    @staticmethod
    def make(store: dict[int, dict[str, torch.Tensor]]) -> Any:
        from transformers import TrainerCallback

        class Snap(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                model = kw["model"]
                store[state.global_step] = full_state(model)

        return Snap()


def full_state(model: Any) -> dict[str, torch.Tensor]:
    """Every parameter as a full tensor (a DTensor gathered), by its unwrapped name."""
    out = {}
    for name, p in model.named_parameters():
        t = p.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        out[name.removeprefix("module.")] = t.clone()
    return out


def log_rows(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-step log rows (those with a loss) of a trainer's log_history."""
    return [r for r in history if "loss" in r and "train_loss" not in r]


# ---- the oracle: the plain trainers in one process ----------------------------------------


def reference_samples(data: dict[str, str], corpus: str, steps: int) -> list[list[str]]:
    """The sample keys of every global batch the fcp runs train, in step order (epochs back
    to back), from fcp's sampler alone (one replica: the samples do not depend on the plan)."""
    loader = make_loader(data, corpus, 1, 0)
    out: list[list[str]] = []
    epoch = 0
    while len(out) < steps:
        loader.set_epoch(epoch)
        keys: list[str] = []
        for mb in loader:
            keys += list(mb.keys)
            if mb.is_last_wave:
                out.append(keys)
                keys = []
                if len(out) == steps:
                    break
        epoch += 1
    return out


def _text_documents(data: dict[str, str], keys: list[str]) -> list[list[int]]:
    """The documents as the plain Trainer gets them: the tokenizer's ids and the EOD."""
    tok = load_tokenizer(data)
    by_key = {f"t{i:02d}": _text(n, i) for i, n in enumerate(TEXT_WORDS)}
    return [
        tok(by_key[k], add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for k in keys
    ]


def _pad_collate(rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Each document its own row, right-padded; labels -100 on padding (the model shifts)."""
    n = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), n, dtype=torch.long)
    mask = torch.zeros(len(rows), n, dtype=torch.long)
    labels = torch.full((len(rows), n), -100, dtype=torch.long)
    for i, r in enumerate(rows):
        k = len(r["input_ids"])
        ids[i, :k] = torch.tensor(r["input_ids"])
        mask[i, :k] = 1
        labels[i, :k] = torch.tensor(r.get("labels", r["input_ids"]))
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def reference_run(
    data: dict[str, str], models: dict[str, str], kind: str, corpus: str, out: Path
) -> dict[str, Any]:
    """The plain Trainer (text) or SFTTrainer (chats) in one process: the same samples per
    step in fcp's order, one step per global batch of padded rows, sdpa attention. One thread
    (as the fcp processes): the same sums on any machine, and no fight for shared cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _reference_run(data, models, kind, corpus, out)
    finally:
        torch.set_num_threads(threads)


def _reference_run(
    data: dict[str, str], models: dict[str, str], kind: str, corpus: str, out: Path
) -> dict[str, Any]:
    import datasets
    import transformers

    steps = STEPS if corpus == "text" else SFT_STEPS
    batches = reference_samples(data, corpus, steps)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        models[kind], attn_implementation="sdpa", dtype=torch.float32
    )
    params: dict[int, dict[str, torch.Tensor]] = {0: full_state(model)}
    common = training_args(out, steps, per_device_train_batch_size=GLOBAL_BATCH,
                           train_sampling_strategy="sequential")  # fmt: skip
    if corpus == "text":
        rows = [{"input_ids": d} for keys in batches for d in _text_documents(data, keys)]
        trainer = transformers.Trainer(
            model=model,
            args=transformers.TrainingArguments(**common),
            train_dataset=datasets.Dataset.from_list(rows),
            data_collator=_pad_collate,
            callbacks=[ParamHistory.make(params)],
        )
    else:
        import trl

        conv = chats()
        by_key = {str(i): conv[i] for i in range(len(conv))}
        keys_in_order = [k for keys in batches for k in keys]
        rows = [{"messages": by_key[_chat_index(k)]} for k in keys_in_order]
        trainer = trl.SFTTrainer(
            model=model,
            args=trl.SFTConfig(
                **common,
                assistant_only_loss=True,
                bf16=False,
                max_length=None,
                shuffle_dataset=False,
            ),
            train_dataset=datasets.Dataset.from_list(rows),
            processing_class=load_tokenizer(data),
            callbacks=[ParamHistory.make(params)],
        )
    trainer.train()
    result: dict[str, Any] = {"logs": log_rows(trainer.state.log_history), "params": params}
    if corpus == "chat":
        ds = trainer.train_dataset
        result["tokenized"] = {
            k: (ds[i]["input_ids"], ds[i]["labels"]) for i, k in enumerate(keys_in_order)
        }
    return result


def _chat_index(key: str) -> str:
    """The chat's position in `chats()` from its JSON Lines key ("line N", counted from 1)."""
    digits = "".join(c for c in str(key).rsplit("/", 1)[-1] if c.isdigit())
    return str(int(digits) - 1)


def fcp_documents(data: dict[str, str], corpus: str) -> dict[str, tuple[list[int], list[int]]]:
    """Per key: fcp's ids and the ids it trains on (-100 elsewhere), unshifted like TRL's."""
    loader = make_loader(data, corpus, 1, 0)
    out = {}
    for mb in loader:
        cu, cup = mb.cu_seqlens.tolist(), mb.cu_seqlens_padded.tolist()
        for j, key in enumerate(mb.keys):
            a, n = cup[j], cu[j + 1] - cu[j]
            ids = mb.tokens[a : a + n].tolist()
            trained = mb.loss_mask[a : a + n - 1].bool().tolist()
            labels = [-100] + [t if m else -100 for t, m in zip(ids[1:], trained)]
            out[str(key)] = (ids, labels)
    return out


# ---- the fcp side: 4 processes ---------------------------------------------------------------


def _torchrun_env(rank: int, world: int) -> None:
    """What torchrun sets (the process group is already up: accelerate joins it)."""
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT="0",
    )  # fmt: skip
    np.random.seed(rank)


PLANTS = ("scale", "leak", "positions")


def _trainer_class(base: type, plant: str | None = None) -> type:
    """with_fcp(base), or with one planted bug: the loss not multiplied by the processes DDP
    averages over ("scale"), the documents of a degree-1 pack run as one sequence ("leak"),
    the model left to number positions itself ("positions")."""
    from fcp_exec.hf_trainer import with_fcp
    from fcp_exec.layout import ShardLayout

    cls = with_fcp(base)
    if plant is None:
        return cls

    class Planted(cls):  # type: ignore[misc, valid-type]
        def fcp_loss_scale(self) -> float:
            return 1.0 if plant == "scale" else super().fcp_loss_scale()

        def fcp_model_inputs(self, mb: Any, binding: Any) -> dict[str, Any]:
            kw = super().fcp_model_inputs(mb, binding)
            if plant == "positions":
                kw.pop("position_ids")
            if plant == "leak" and mb.degree == 1 and len(mb.keys) > 1:
                n = int(mb.tokens.numel())
                cu = torch.tensor([0, n], dtype=torch.int32)
                kw.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=n, max_length_k=n,
                          fcp_cu_seqlens_padded=cu, fcp_causal=(True,),
                          fcp_layout=ShardLayout.build([0, n], [0, n], 1, (True,)))  # fmt: skip
            return kw

    return Planted


def _micro_batches(trainer: Any) -> list[tuple[int, bool]]:
    """(degree, is_placeholder) of every micro-batch this rank trained, gathered per rank."""
    return [(int(r), bool(p)) for r, p in trainer._job_seen]


def _watch(trainer: Any) -> None:
    """Record the micro-batches each step trains (wraps the mixin's model inputs)."""
    trainer._job_seen = []
    inner = trainer.fcp_model_inputs

    def record(mb: Any, binding: Any) -> dict[str, Any]:
        trainer._job_seen.append((mb.degree, mb.is_placeholder))
        return inner(mb, binding)

    trainer.fcp_model_inputs = record


def _finish(trainer: Any, rank: int) -> dict[str, Any]:
    import torch.distributed as dist

    seen: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(seen, _micro_batches(trainer))
    params = full_state(trainer.model)  # collective for sharded parameters
    if rank:
        return {}
    history = [dict(zip(r.__slots__, (getattr(r, s) for s in r.__slots__))) for r in
               trainer.fcp_history]  # fmt: skip
    return {"logs": log_rows(trainer.state.log_history), "params": params, "seen": seen,
            "history": history}  # fmt: skip


def _text_run(rank: int, data: dict, models: dict, out: Path, plant: str | None, steps: int) -> Any:
    import transformers

    from fcp_exec.hf import register_attention

    model = transformers.AutoModelForCausalLM.from_pretrained(
        models["llama"], attn_implementation=register_attention(), dtype=torch.float32
    )
    cls = _trainer_class(transformers.Trainer, plant)
    args = transformers.TrainingArguments(**training_args(out, steps, ddp_backend="gloo"))
    trainer = cls(model=model, args=args, fcp_loader=make_loader(data, "text", WORLD, rank))
    _watch(trainer)
    trainer.train()
    assert isinstance(trainer.model_wrapped, torch.nn.parallel.DistributedDataParallel)
    return _finish(trainer, rank)


def _fsdp_model(models: dict) -> Any:
    import transformers
    from transformers.distributed import DistributedConfig

    from fcp_exec.hf import register_attention

    return transformers.AutoModelForCausalLM.from_pretrained(
        models["qwen3"],
        attn_implementation=register_attention(),
        dtype=torch.float32,
        distributed_config=DistributedConfig(fsdp_size=WORLD),
    )


def _fsdp_run(rank: int, data: dict, models: dict, out: Path) -> Any:
    import transformers

    model = _fsdp_model(models)
    weight = model.model.layers[0].mlp.up_proj.weight
    sharding = (str(tuple(weight.placements)), int(weight.to_local().numel()), weight.numel())
    args = transformers.TrainingArguments(**training_args(out, STEPS, ddp_backend="gloo"))
    cls = _trainer_class(transformers.Trainer)
    trainer = cls(model=model, args=args, fcp_loader=make_loader(data, "text", WORLD, rank))
    _watch(trainer)
    trainer.train()
    result = _finish(trainer, rank)
    result["sharding"] = sharding
    return result


def _refused(make: Any) -> str:
    from fcp_data.errors import ConfigError

    try:
        make()
    except ConfigError as e:
        return str(e)
    return ""


def _dist_refusals(rank: int, data: dict, models: dict, out: Path) -> dict[str, str]:
    """What only a distributed job can show: a loader of another replica or world size, and
    fcp's own FSDP sum rule on a model the Trainer already scales."""
    import transformers

    from fcp_exec.fsdp import fsdp_sum_gradients
    from fcp_exec.hf import register_attention

    cls = _trainer_class(transformers.Trainer)
    args = transformers.TrainingArguments(**training_args(out, 1, ddp_backend="gloo"))
    model = transformers.AutoModelForCausalLM.from_pretrained(
        models["llama"], attn_implementation=register_attention(), dtype=torch.float32
    )
    other = (rank + 1) % WORLD
    res = {
        "replica": _refused(lambda: cls(model=model, args=args,
                                        fcp_loader=make_loader(data, "text", WORLD, other))),
        "world": _refused(lambda: cls(model=model, args=args,
                                      fcp_loader=make_loader(data, "text", 2, rank % 2))),
    }  # fmt: skip
    sharded = _fsdp_model(models)
    fsdp_sum_gradients(sharded)
    res["fsdp_sum"] = _refused(
        lambda: cls(model=sharded, args=args, fcp_loader=make_loader(data, "text", WORLD, rank))
    )
    return res


def _sft_run(rank: int, data: dict, models: dict, out: Path, resume: str | None) -> Any:
    import transformers
    import trl

    from fcp_exec.hf import register_attention

    model = transformers.AutoModelForCausalLM.from_pretrained(
        models["llama"], attn_implementation=register_attention(), dtype=torch.float32
    )
    config = trl.SFTConfig(
        **training_args(out, SFT_STEPS, ddp_backend="gloo", save_strategy="steps",
                        save_steps=SFT_RESUME_AT, save_only_model=False),
        assistant_only_loss=True, bf16=False, max_length=None,
    )  # fmt: skip
    cls = _trainer_class(trl.SFTTrainer)
    trainer = cls(model=model, args=config, processing_class=load_tokenizer(data),
                  fcp_loader=make_loader(data, "chat", WORLD, rank))  # fmt: skip
    _watch(trainer)
    trainer.train(resume_from_checkpoint=resume)
    return _finish(trainer, rank)


def trainer_worker(rank: int, world: int, data_json: str, models_json: str, out: str) -> None:
    """Every fcp case on one spawn of 4 processes; rank 0 saves the results to out/result.pt."""
    import time

    _torchrun_env(rank, world)
    torch.set_num_threads(1)
    data, models, root = json.loads(data_json), json.loads(models_json), Path(out)
    res: dict[str, Any] = {"seconds": {}}

    def case(name: str, fn: Any, *a: Any) -> None:
        t = time.perf_counter()
        res[name] = fn(*a)
        res["seconds"][name] = time.perf_counter() - t

    case("ddp", _text_run, rank, data, models, root / "ddp", None, STEPS)
    for plant in PLANTS:
        case(f"plant-{plant}", _text_run, rank, data, models, root / plant, plant, 1)
    case("fsdp", _fsdp_run, rank, data, models, root / "fsdp")
    case("refusals", _dist_refusals, rank, data, models, root / "refusals")
    case("sft", _sft_run, rank, data, models, root / "sft", None)
    ckpt = str(root / "sft" / f"checkpoint-{SFT_RESUME_AT}")
    case("sft-resumed", _sft_run, rank, data, models, root / "sft-resumed", ckpt)
    if rank == 0:
        torch.save(res, root / "result.pt")
