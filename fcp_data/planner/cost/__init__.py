"""The cost model's room: what a batch costs on a cluster, before any strategy runs.

One job per module, imported by their own names (this package exports nothing itself, so
importing one module does not load the others). What depends on what, bottom up:

    transports, vision_work      leaves: head-parallel bytes and degrees; per-sample encoder work
    presets                      model and device tables (imports nothing of this room)
    vision                       VisionCost / VisionLoad (vision_work, kernels.vision)
    vision_presets               encoder tables and their VisionCost estimate (vision)
    memory                       the memory model of a parallel layout (presets)
    cluster                      replicas, nodes, capacity, speed (memory)
    model                        CostModel: the time and memory formulas (cluster, presets, vision)
    estimate                     CostModel from a model and a device preset (model, presets,
                                 transports, vision_presets)
    problem                      one batch priced for the strategies (cluster, model,
                                 transports, vision, kernels)

One cycle is left, on purpose: `CostModel.from_model` imports `estimate` inside the method,
since the estimate builds CostModels. Nothing here imports the strategies or the planner above.
"""
