"""The agent's reading of vLLM's Prometheus page (agent/engine_load.py): both gauges summed over
the models an engine serves (an adapter's engine serves two), labels with spaces or braces in their
values, and a page without the gauges (another engine's metrics) read as none."""

from __future__ import annotations

from sxwl.agent.engine_load import gauges

PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="chat-base"} 2.0
vllm:num_requests_running{engine="0",model_name="a {b} c"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="chat-base"} 4.0
vllm:num_requests_waiting_by_reason{reason="capacity"} 9.0
vllm:num_requests_swapped 7
vllm:num_requests_waiting not-a-number
"""


def test_vllm_s_gauges_are_summed_over_its_models() -> None:
    assert gauges(PAGE) == (3, 4)
    assert gauges("vllm:num_requests_running 5\n") == (5, 0)


def test_a_page_without_the_gauges_is_none() -> None:
    assert gauges("# HELP process_cpu_seconds_total\nprocess_cpu_seconds_total 1.5\n") is None
    assert gauges("") is None
