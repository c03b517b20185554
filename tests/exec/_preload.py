"""Imported once by the forkserver that `_dist.run_distributed` forks its gloo processes from.

torch, torch.distributed and fcp_exec, and the torch parts megatron-core imports (dynamo,
inductor, DTensor, FSDP, checkpoint, ...): a job process then imports only its own modules.
megatron-core itself is not imported here: `cp_context` binds megatron's parallel state only
when the job imported it (`sys.modules`), and jobs without megatron must stay without it.
Nothing here runs a torch op or creates a thread, so forking from this process is safe.
"""

from __future__ import annotations

import contextlib
import importlib
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # as `_dist._child`: before torch reads it

for _name in (
    "torch",
    "torch.distributed",
    "fcp_exec",
    "fcp_data.collate",
    "fcp_data.planner",
    # what megatron-core pulls in of torch (and its own deps); ~5 s of its ~6 s import
    "torch._dynamo",
    "torch._inductor.compile_fx",
    "torch._functorch.aot_autograd",
    "torch.fx.experimental.symbolic_shapes",
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
    "torch.distributed._composable",
    "torch.distributed.nn",
    "torch.distributed.elastic",
    "torch.nn.attention.flex_attention",
    "torch.utils.cpp_extension",
    "torch.onnx",
):
    with contextlib.suppress(ImportError):  # an optional part missing: imported later, if used
        importlib.import_module(_name)
