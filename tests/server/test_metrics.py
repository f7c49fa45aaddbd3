"""Metrics: names, labels, independence of registries, exposition output."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from streamd.config import EndpointingConfig
from streamd.engine.types import ChunkResult
from streamd.session.utterances import UtteranceTracker
from streamd.server.metrics import ATTENTION_PATHS, CONTENT_TYPE, MIGRATION_RESULTS, REJECTION_REASONS, Metrics


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_expected_series_exist_at_zero() -> None:
    got = samples(Metrics(process=False))
    for name in ("streamd_streams_active", "streamd_connections_total", "streamd_audio_seconds_total",
                 "streamd_decode_step_seconds_count", "streamd_batch_size_count",
                 "streamd_partial_latency_seconds_count",
                 "streamd_final_latency_seconds_count", "streamd_realtime_factor",
                 "streamd_migration_pause_seconds_count", "streamd_cuda_graph_fallbacks_total",
                 "streamd_migration_recapture_seconds_count", "streamd_migration_serving_gap_seconds_count"):
        assert got[(name, ())] == 0.0, name
    for part in ("encoder", "decoder"):
        assert got[("streamd_cuda_graphs_in_use", (("part", part),))] == 0.0
        for path in ("graphs", "padded", "eager"):
            assert got[("streamd_engine_calls_total", (("part", part), ("path", path)))] == 0.0
    for path in ATTENTION_PATHS:  # until the first step says otherwise
        assert got[("streamd_attention_path", (("path", path),))] == (path == "explicit")
    for reason in REJECTION_REASONS:
        assert got[("streamd_connections_rejected_total", (("reason", reason),))] == 0.0
    for result in MIGRATION_RESULTS:
        assert got[("streamd_migrations_total", (("result", result),))] == 0.0
    assert got[("streamd_endpoints_total", (("rule", "max_utterance"),))] == 0.0


def test_attention_path_names_one_path() -> None:
    m = Metrics(process=False)
    m.set_attention("kernel")
    m.set_attention("kernel")
    got = samples(m)
    assert [p for p in ATTENTION_PATHS if got[("streamd_attention_path", (("path", p),))] == 1.0] == ["kernel"]
    m.set_attention("sdpa")  # the kernel could not be built: the reference serves
    got = samples(m)
    assert [p for p in ATTENTION_PATHS if got[("streamd_attention_path", (("path", p),))] == 1.0] == ["sdpa"]


def test_engine_calls_count_the_increase_of_the_engines_totals_by_path() -> None:
    m = Metrics(process=False)
    m.set_calls(10, (4, 1))  # 10 calls: the encoder ran 4 eagerly, the decoder 1
    m.set_calls(25, (6, 1), (3, 0))  # 15 more: the encoder 2 eagerly and 3 padded
    got = samples(m)
    calls = {(part, path): got[("streamd_engine_calls_total", (("part", part), ("path", path)))]
             for part in ("encoder", "decoder") for path in ("graphs", "padded", "eager")}
    assert calls == {("encoder", "graphs"): 16.0, ("encoder", "padded"): 3.0, ("encoder", "eager"): 6.0,
                     ("decoder", "graphs"): 24.0, ("decoder", "padded"): 0.0, ("decoder", "eager"): 1.0}


def test_endpoints_are_counted_by_rule() -> None:
    m = Metrics(process=False)
    tracker = UtteranceTracker(EndpointingConfig(240, 400, 0), 80, on_endpoint=m.count_endpoint)
    tracker.on_chunk(ChunkResult([5], [1], 0, 20))  # speech at 1, 3 silent frames: endpoint at 4
    got = samples(m)
    assert got[("streamd_endpoints_total", (("rule", "silence_after_speech"),))] == 1.0
    assert got[("streamd_endpoints_total", (("rule", "silence_without_speech"),))] == 3.0  # 5..19
    assert "streamd_batch_wait_seconds_count" not in {name for name, _ in got}  # nothing records it


def test_registries_are_independent() -> None:
    a, b = Metrics(), Metrics()
    a.connections.inc()
    a.rejections.labels("overloaded").inc(2)
    a.streams_active.set(5)
    got_a, got_b = samples(a), samples(b)
    assert got_a[("streamd_connections_total", ())] == 1.0
    assert got_a[("streamd_connections_rejected_total", (("reason", "overloaded"),))] == 2.0
    assert got_a[("streamd_streams_active", ())] == 5.0
    assert got_b[("streamd_connections_total", ())] == 0.0
    assert got_b[("streamd_streams_active", ())] == 0.0


def test_observe_step() -> None:
    m = Metrics(process=False)
    m.observe_step(0.02, batch_size=12, chunk_seconds=0.16)
    m.observe_step(0.04, batch_size=3, chunk_seconds=0.16)
    got = samples(m)
    assert got[("streamd_decode_step_seconds_count", ())] == 2.0
    assert abs(got[("streamd_decode_step_seconds_sum", ())] - 0.06) < 1e-9
    assert got[("streamd_batch_size_bucket", (("le", "4.0"),))] == 1.0
    assert got[("streamd_batch_size_bucket", (("le", "16.0"),))] == 2.0
    assert got[("streamd_realtime_factor", ())] == 0.25


def test_latency_histograms_are_in_seconds() -> None:
    m = Metrics(process=False)
    m.partial_latency.observe(0.3)
    m.final_latency.observe(1.0)
    got = samples(m)
    assert got[("streamd_partial_latency_seconds_bucket", (("le", "0.24"),))] == 0.0
    assert got[("streamd_partial_latency_seconds_bucket", (("le", "0.32"),))] == 1.0
    assert got[("streamd_final_latency_seconds_bucket", (("le", "1.28"),))] == 1.0


def test_model_info_is_replaced_on_change() -> None:
    m = Metrics(process=False)
    m.set_model("tiny", "cuda:0", "fp32")
    m.set_model("tiny", "cuda:1", "bf16")
    info = {labels: v for (name, labels), v in samples(m).items() if name == "streamd_model_info"}
    assert info == {(("device", "cuda:1"), ("dtype", "bf16"), ("model", "tiny")): 1.0}


def test_process_collectors_are_optional() -> None:
    with_process = {name for name, _ in samples(Metrics())}
    without = {name for name, _ in samples(Metrics(process=False))}
    assert "python_info" in with_process and "python_info" not in without
    assert not any(name.startswith("process_") for name in without)


def test_content_type() -> None:
    assert CONTENT_TYPE.startswith("text/plain")
    assert Metrics(namespace="asr", process=False).render().startswith(b"# HELP asr_")
