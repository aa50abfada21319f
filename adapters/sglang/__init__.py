"""SGLang plugin (installed as planner.adapters.sglang): hooks registered
through SGLang's ``sglang.srt.plugins`` entry point and ``HookRegistry`` that
let the planner choose retraction victims, order the waiting queue, rotate
the running batch and swap KV through SGLang's host KV pool, falling back to
SGLang's own policy whenever the planner does not answer in time.

Read against SGLang 0.5.23 (see ``engine_types`` for the attributes used)."""

SGLANG_VERSION_READ = "0.5.23"
