"""The in-process shim: the only part of the planner an engine adapter runs
inside the engine's own process (DESIGN.md §1). Everything else an adapter
reaches over gRPC, through planner.client, planner.rpc and planner.v1.

- :mod:`.service`: the server's own handler table, for an adapter whose
  channel has no target (planner.adapters.common.channel loads it on the
  planner thread it runs the calls on, and only then: the service, its
  policies and solvers are a few hundred MB an engine using a planner
  server does not need).
- :mod:`.deposit`: layer offload's Token-Deposit (OrbitFlow §3.2), which
  paces a request's tokens on the engine's output path; the replay runs the
  same one.

import-linter's adapters contract (pyproject.toml) lets adapters import this
package and not the packages behind it.
"""
