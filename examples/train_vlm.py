"""Train a tiny Qwen2.5-VL-architecture model with fcp: each replica encodes what it holds.

    python examples/train_vlm.py                          # 4 local gloo processes, 3 steps
    python examples/train_vlm.py --replicas 2 --steps 5
    torchrun --nproc-per-node 4 examples/train_vlm.py --out out/vlm   # after one prepare run
    torchrun --nproc-per-node 8 examples/train_vlm.py --device cuda   # NCCL (not run here)
    python examples/train_vlm.py --index my/index --tokenizer my/tokenizer.json --cost my.json
    python examples/train_vlm.py --steps 2 --checkpoint ckpt && \
        python examples/train_vlm.py --steps 1 --resume ckpt          # continues at step 3

The job is `fcp.demo.vlm` (what `fcp demo` runs as its step 4); per micro-batch it does:

    with cp_context(mb.rank_plan, groups=cache, wave_groups=mb.wave_groups) as cp:
        embeds = lm.embed_tokens(mb.tokens)
        embeds = encode_and_scatter(model.model.visual, mb, embeds, group=cp.group,
                                    pad_ids=(model.config.image_token_id,
                                             model.config.video_token_id))
        hidden = lm(inputs_embeds=embeds[None], position_ids=hf_position_ids(mb),
                    **hf_attention_kwargs(mb, cp)).last_hidden_state
        loss = (token_ce(model.lm_head(hidden)[0], mb.labels) * mb.loss_mask).sum()
        (loss / mb.global_num_loss_tokens).backward()
    # after the last wave: all_reduce_gradients(model) (a SUM), optimizer step

`encode_and_scatter` runs the vision tower only on the tubelets whose tokens this replica
holds (about 1/d of each video plus at most 2 edge tubelets per sequence) and writes each of
its tokens once; the decoder runs transformers' own layers with attn_implementation "fcp_ring"
(registered by `fcp_exec.hf.register_attention`). Printed per step: the plan (waves, degrees),
the tubelets each replica encoded / the tubelets of the whole videos its groups hold, the
planner's predicted time and the measured forward + backward time, the step's wall time,
tokens/s and the time it waited for data; a summary closes the run.
"""

from __future__ import annotations

import sys

from fcp.demo.vlm import main

if __name__ == "__main__":
    sys.exit(main())
