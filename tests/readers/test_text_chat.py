"""Text chat samples ({"messages": [...]}) in JSONL, Parquet and tar .json: counted exactly,
rendered as ChatML, loss only on the asked roles."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sources_helpers import (
    EOD,
    assert_same_batches,
    epoch_fields,
    make_loader,
    train_bpe,
    write_tar,
)

from fcp_data.errors import ConfigError, SampleError
from fcp_data.readers import build_index
from fcp_data.readers.chat_text import encode_text_chat
from fcp_data.readers.scan import ScanConfig
from fcp_data.readers.text import as_tokenizer

CHATS = [
    [
        {"role": "system", "content": f"You are helper number {i}."},
        {"role": "user", "content": "What is " + "two plus two " * (i % 5 + 1) + "?"},
        {"role": "assistant", "content": "It is four. " * (i % 7 + 1)},
        *(
            [
                {"role": "tool", "content": '{"result": 4}'},
                {"role": "assistant", "content": "Confirmed by the tool."},
            ]
            if i % 3 == 0
            else []
        ),
    ]
    for i in range(24)
]
CONFIG = {"text_field": "messages"}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("src-chat")


@pytest.fixture(scope="module")
def bpe(root: Path) -> str:
    texts = [t["content"] for c in CHATS for t in c] + ["<|im_start|>assistant\n<|im_end|>\n"]
    return str(train_bpe(root / "bpe.json", texts))


def test_chat_counts_and_loss_follow_the_roles(root: Path, bpe: str) -> None:
    path = root / "chat.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CHATS))
    index = build_index(str(path), root / "i", config=ScanConfig(tokenizer=bpe, **CONFIG))
    tok = as_tokenizer(bpe)
    ld = make_loader(index, bpe, n=1)
    enc = ld._builder.encoder
    for i, turns in enumerate(CHATS):
        sample = enc(index, i)
        # the index counted exactly the rendered tokens (+ 1 EOD)
        assert len(sample.tokens) == int(index.seqlens[i])
        # ChatML: header, content, end per turn, each piece tokenized on its own
        want: list[int] = []
        targets: list[bool] = []
        for t in turns:
            for text, target in (
                (f"<|im_start|>{t['role']}\n", False),
                (t["content"], t["role"] == "assistant"),
                ("<|im_end|>\n", t["role"] == "assistant"),
            ):
                ids = list(tok(text))
                want += ids
                targets += [target] * len(ids)
        assert sample.tokens.tolist() == [*want, EOD]
        assert sample.targets.tolist() == [*targets, True]
    # other loss roles: the tool's answers too
    ids, tg = encode_text_chat(CHATS[0], tok, ("assistant", "tool"))
    tool_ids = list(tok('{"result": 4}'))
    assert tg.sum() > encode_text_chat(CHATS[0], tok)[1].sum() + len(tool_ids) - 1
    ld2 = make_loader(index, bpe, n=1, chat_loss_roles=("user",))
    s2 = ld2._builder.encoder(index, 1)
    assert s2.targets[: len(list(tok("<|im_start|>system\n")))].sum() == 0
    with pytest.raises(ConfigError, match="unknown role"):
        make_loader(index, bpe, n=1, chat_loss_roles=("robot",))
    assert sorted(int(s) for mb in ld for s in mb.sample_ids) == list(range(len(CHATS)))


def test_chat_in_jsonl_parquet_and_tar_gives_one_epoch(root: Path, bpe: str) -> None:
    config = ScanConfig(tokenizer=bpe, **CONFIG)
    tar = write_tar(root / "chat.tar", [{"json": {"messages": c}} for c in CHATS])
    jl = root / "chat2.jsonl"
    jl.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CHATS))
    a = build_index(tar, root / "i-tar", config=config)
    b = build_index(str(jl), root / "i-jsonl", config=config)
    np.testing.assert_array_equal(a.seqlens, b.seqlens)
    assert_same_batches(epoch_fields(make_loader(a, bpe)), epoch_fields(make_loader(b, bpe)))
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [[{"role": t["role"], "content": t["content"]} for t in c] for c in CHATS]
    pq.write_table(pa.table({"messages": rows}), root / "chat.parquet", row_group_size=5)
    c = build_index(str(root / "chat.parquet"), root / "i-pq", config=config)
    np.testing.assert_array_equal(a.seqlens, c.seqlens)
    assert_same_batches(epoch_fields(make_loader(a, bpe)), epoch_fields(make_loader(c, bpe)))


def test_bad_chat_samples_are_named(root: Path, bpe: str) -> None:
    bad = [
        [{"role": "robot", "content": "beep"}],
        [{"role": "user", "content": "look <image> here"}],
        [{"role": "assistant", "content": None}],
        CHATS[0],
    ]
    path = root / "bad.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in bad))
    index = build_index(str(path), root / "i-bad", config=ScanConfig(tokenizer=bpe, **CONFIG))
    assert list(index.keys) == ["line 4"]
    reasons = [s.reason for s in index.skipped]
    assert "role 'robot'" in reasons[0] and "tool" in reasons[0]
    assert "<image> marker" in reasons[1]
    assert "NoneType content" in reasons[2]
    with pytest.raises(SampleError, match=r"sample 'line 1': chat turn 0 has role 'robot'"):
        build_index(
            str(path), root / "i-bad2", config=ScanConfig(tokenizer=bpe, on_error="raise", **CONFIG)
        )


@pytest.mark.parametrize("store", [None, True])
def test_a_token_store_leaves_chats_to_the_loader(root: Path, bpe: str, store) -> None:
    """A store keeps ids, not loss targets: chats get an empty span (the loader renders them
    and their targets from the turns), plain text lines beside them are stored, and the
    micro-batches (loss masks and global loss counts included) equal the store-less ones.
    Both the default store (None) and --store-tokens (True): the latter used to refuse."""
    from fcp_data.readers import TokenStore

    path = root / f"mixed-{store}.jsonl"
    rows = [{"messages": c} for c in CHATS[:8]] + [
        {"messages": f"plain {i} " * 9} for i in range(8)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    index = build_index(
        str(path), root / f"i-store-{store}", config=ScanConfig(tokenizer=bpe, **CONFIG),
        store_tokens=store,
    )  # fmt: skip
    held = TokenStore.open(index.path, index=index)
    assert [held.has(i) for i in range(len(index))] == [False] * 8 + [True] * 8
    with_store = make_loader(index, bpe, n=2)
    assert with_store._builder.encoder.store is not None  # really read from the store
    for r in range(2):
        a = epoch_fields(make_loader(index, bpe, n=2, replica=r))
        b = epoch_fields(make_loader(index, bpe, n=2, replica=r, token_store=False))
        assert_same_batches(a, b)
    counts = [[mb.global_num_loss_tokens for mb in make_loader(index, bpe, n=2, token_store=s)]
              for s in (True, False)]  # fmt: skip
    assert counts[0] == counts[1]


@pytest.mark.parametrize("roles", [("assistant",), ("assistant", "tool"), ("user",)])
def test_the_global_loss_count_is_the_chats_targets_on_every_replica(
    root: Path, bpe: str, roles: tuple[str, ...]
) -> None:
    """Each replica divides its loss by global_num_loss_tokens: it must be the number of loss
    tokens all replicas hold together (the loss roles' tokens), not every token, and the same
    on every replica, or the gradient is silently scaled."""
    path = root / "count.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CHATS))
    index = build_index(str(path), root / "i-count", config=ScanConfig(tokenizer=bpe, **CONFIG))
    held: dict[int, int] = {}
    claimed: dict[int, set[int]] = {}
    for r in range(2):
        for mb in make_loader(index, bpe, n=2, replica=r, chat_loss_roles=roles):
            held[mb.batch_index] = held.get(mb.batch_index, 0) + int(mb.loss_mask.sum())
            claimed.setdefault(mb.batch_index, set()).add(int(mb.global_num_loss_tokens))
    every = int(sum(int(s) - 1 for s in index.seqlens))
    assert sum(held.values()) < every  # the system / user turns carry no loss
    for b, counts in claimed.items():
        assert counts == {held[b]}, (b, counts, held[b])


def test_a_chat_from_a_source_without_a_member_table_is_refused(root: Path, bpe: str) -> None:
    """Without a member table the global loss count cannot see a chat's targets (reading every
    sample on every replica is not done): such a chat is refused by name, never miscounted."""
    from fcp_data.readers import ScannedSource

    path = root / "scan.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CHATS[:4]))
    scanned = ScannedSource.scan(str(path), config=ScanConfig(tokenizer=bpe, **CONFIG))
    with pytest.raises(ConfigError, match="without a member table"):
        list(make_loader(scanned, bpe, n=1, gbs=4))


def test_the_chat_loss_covers_the_final_eod_and_the_docs_say_so(root: Path, bpe: str) -> None:
    """The last turn's `<|im_end|>\\n` predicts EOD with loss, even when a user turn ends the
    chat; docs/formats.md said only "the loss-role turns" (now it names the final EOD)."""
    path = root / "eod.jsonl"
    ends_with_user = [*CHATS[1], {"role": "user", "content": "Thanks."}]
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in (CHATS[0], ends_with_user)))
    index = build_index(str(path), root / "i-eod", config=ScanConfig(tokenizer=bpe, **CONFIG))
    seen = 0
    for mb in make_loader(index, bpe, n=1, gbs=2):
        cu, at = mb.cu_seqlens.tolist(), mb.local_cu_seqlens_padded.tolist()
        for k in range(len(mb.sample_ids)):  # one replica: every sequence whole, padded apart
            last = at[k] + cu[k + 1] - cu[k] - 2  # the token before EOD: its label is EOD
            assert int(mb.labels[last]) == EOD and float(mb.loss_mask[last]) == 1.0
            # before it: the assistant's `<|im_end|>\n` is trained on, the user's is not
            assert float(mb.loss_mask[last - 1]) == (1.0 if mb.sample_ids[k] == 0 else 0.0)
            seen += 1
    assert seen == 2
    docs = (Path(__file__).parents[2] / "docs" / "formats.md").read_text()
    assert "plus the end-of-document id(s) after the last turn, whatever its role" in docs
