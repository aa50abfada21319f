import numpy as np

from planner.domain.requests import Slo
from planner.replay.scalar_columns import ScalarColumns, float_view, int_view
from planner.replay.state import RequestColumns
from planner.trace.records import TraceRequest


def _columns() -> RequestColumns:
    trace = [
        TraceRequest(arrival_s=0.0, prompt_tokens=10, output_tokens=3),
        TraceRequest(arrival_s=1.0, prompt_tokens=2**40, output_tokens=7),
    ]
    return RequestColumns.from_trace(trace, Slo(ttft_s=1.0, tbt_s=0.1))


def test_views_read_the_columns_as_python_scalars() -> None:
    r = _columns()
    views = ScalarColumns(r)
    assert views.prefill_target[1] == 2**40
    assert type(views.prefill_target[1]) is int
    assert views.output_tokens[0] == 3
    assert np.isnan(views.first_token_s[0])
    assert type(views.first_token_s[0]) is float


def test_writes_through_views_are_writes_to_the_columns() -> None:
    r = _columns()
    views = ScalarColumns(r)
    views.kv_tokens[1] = -(2**50)
    views.generated[0] = 5
    views.gpu_blocks[1] = 9
    views.last_token_s[0] = 0.1 + 0.2
    assert r.kv_tokens.tolist() == [0, -(2**50)]
    assert r.generated.tolist() == [5, 0]
    assert r.gpu_blocks.tolist() == [0, 9]
    assert r.last_token_s[0] == 0.1 + 0.2


def test_int32_and_float_views() -> None:
    small = np.full(4, -1, dtype=np.int32)
    int_view(small)[2] = 2**31 - 1
    assert small.tolist() == [-1, -1, 2**31 - 1, -1]
    floats = np.zeros(3)
    float_view(floats)[1] = 1e-300
    assert floats[1] == 1e-300
