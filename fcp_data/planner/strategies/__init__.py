"""The planner's strategies: each turns a priced batch (`cost.problem.Problem`) into schedules.

`schedule.Schedule` is the form every candidate takes (CP groups in execution order, scored on
the Problem); `families.FAMILIES` is the table of strategies, name -> candidate family, and the
planner's `STRATEGIES` is its keys. The candidate modules: `paper` (BFD + 2D-DP waves),
`lanes` (mixed-degree lanes, static-balanced), `moldable` (list scheduling), `fill` (idle
slots filled, waves aligned), `placement` (groups kept inside nodes), `baselines` (static CP,
megatron-core's BalancedCPScheduler), `megatron_dynamic` (Megatron-LM dev's dynamic CP).
Strategies import the cost room and the kernels, never the planner above them: turning the
winner into a Plan is `planner.assemble`. Nothing is exported here; import the modules.
"""
