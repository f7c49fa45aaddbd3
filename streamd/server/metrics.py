"""Prometheus metrics of one daemon, in a registry of their own.

Names follow Prometheus conventions: ``streamd_<what>_<unit>``, ``_total`` on
counters, base units (seconds). Latencies are in *audio* time: seconds of
audio the server had received but whose words were not yet in the result when
it was sent, so they measure the pipeline, not the network.
"""
from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from streamd.session.endpoint import EndpointRule


CONTENT_TYPE = CONTENT_TYPE_LATEST
REJECTION_REASONS = ("overloaded", "draining", "stalled", "unauthorized", "origin", "bad_request")
MIGRATION_RESULTS = ("ok", "failed")
ENDPOINT_RULES = ("silence_after_speech", "silence_without_speech", "max_utterance")
BACKLOG_ACTIONS = ("paced", "closed")
RESUME_RESULTS = ("resumed", "fresh", "refused", "handoff")
AUDIO_PATHS = ("shared", "inline")
ATTENTION_PATHS = ("kernel", "sdpa", "explicit")  # `RelPositionMultiHeadAttention.streaming_path`

_LATENCY_BUCKETS = (0.08, 0.16, 0.24, 0.32, 0.48, 0.64, 0.96, 1.28, 1.92, 2.56, 3.84, 5.12, 10.24)
_STEP_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_PAUSE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    """Every streamd metric, registered in ``self.registry``.

    Args:
        namespace: metric name prefix.
        process: also export the ``process_*``, ``python_*`` and GC collectors.
    """

    def __init__(self, namespace: str = "streamd", *, process: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r, ns = self.registry, namespace
        if process:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)
        self.streams_active = Gauge("streams_active", "Open streams.", namespace=ns, registry=r)
        self.connections = Counter("connections", "Accepted stream connections.", namespace=ns,
                                   registry=r)
        self.rejections = Counter("connections_rejected", "Refused connections by reason.",
                                  ["reason"], namespace=ns, registry=r)
        self.audio_seconds = Counter("audio_seconds", "Audio received, in seconds.", namespace=ns,
                                     registry=r)
        self.step_seconds = Histogram("decode_step_seconds", "Wall time of one batched decode step.",
                                      namespace=ns, registry=r, buckets=_STEP_BUCKETS)
        self.batch_size = Histogram("batch_size", "Streams per decode step.", namespace=ns,
                                    registry=r, buckets=_BATCH_BUCKETS)
        self.partial_latency = Histogram(
            "partial_latency_seconds", "Audio received but not reflected in a partial when sent.",
            namespace=ns, registry=r, buckets=_LATENCY_BUCKETS)
        self.final_latency = Histogram(
            "final_latency_seconds", "Audio received past an utterance's end when its final was sent.",
            namespace=ns, registry=r, buckets=_LATENCY_BUCKETS)
        self.realtime_factor = Gauge(
            "realtime_factor", "Last decode step's wall time over the audio per stream it decoded "
            "(>= 1 means falling behind).", namespace=ns, registry=r)
        self.backlog = Counter(
            "backlog_events", "Streams that reached max_backlog_s, by what the daemon did "
            "(paced: stopped reading until decoding caught up; closed: backlog_exceeded).",
            ["action"], namespace=ns, registry=r)
        self.endpoints = Counter("endpoints", "Utterances ended by an endpoint rule.", ["rule"],
                                 namespace=ns, registry=r)
        self.model_info = Info("model", "The served model and where it runs.", namespace=ns,
                               registry=r)
        self.migrations = Counter("migrations", "Live migrations by result.", ["result"],
                                  namespace=ns, registry=r)
        self.graph_fallbacks = Counter(
            "cuda_graph_fallbacks", "CUDA graph captures that failed (that batch size runs eagerly).",
            namespace=ns, registry=r)
        self.migration_pause = Histogram(
            "migration_pause_seconds", "Time streams were paused during a migration.",
            namespace=ns, registry=r, buckets=_PAUSE_BUCKETS)
        self.migration_recapture = Histogram(
            "migration_recapture_seconds", "Time a migration spent capturing the target's CUDA graphs "
            "(before its pause, while serving went on).", namespace=ns, registry=r, buckets=_PAUSE_BUCKETS)
        self.migration_gap = Histogram(
            "migration_serving_gap_seconds", "Around a migration: from the last results delivered before its "
            "pause to the first after it.", namespace=ns, registry=r, buckets=_PAUSE_BUCKETS)
        self.graphs_in_use = Gauge(
            "cuda_graphs_in_use", "1 when the last decode step ran this part from CUDA graphs, 0 when eagerly "
            "(the admin status says why).", ["part"], namespace=ns, registry=r)
        self.attention = Gauge(
            "attention_path", "1 for how the engine's steps attend now: kernel (the Triton kernel, on CUDA), sdpa "
            "(on CUDA where the kernel is off or could not be built: the log says why) or explicit (the CPU).",
            ["path"], namespace=ns, registry=r)
        self._attention_path = ""
        self.engine_calls = Counter(
            "engine_calls", "Encoder and decoder calls of the engine's steps (one each per step part), by whether "
            "they replayed their batch size's CUDA graphs (graphs), a larger size's, padded (padded: after a "
            "migration, between the sizes it prepared), or ran eagerly (graphs off, a batch size not captured "
            "yet, a capture that failed).", ["part", "path"], namespace=ns, registry=r)
        # (calls, eager encoder, eager decoder, padded encoder, padded decoder) counted so far
        self._calls_seen = (0, 0, 0, 0, 0)
        self.capacity_estimate = Gauge(
            "capacity_estimate_streams", "Streams this daemon can serve in real time: the largest batch "
            "whose step time fits the admission budget (warm-up probe, then live steps).",
            namespace=ns, registry=r)
        self.capacity = Gauge("capacity_streams", "Streams admitted now: min(max_streams, the estimate).",
                              namespace=ns, registry=r)
        self.resumes = Counter(
            "resumes", "Resume requests by result (resumed: the session continued here; fresh: unknown or "
            "expired, a new session was started; refused: without the session's resume secret, a new session was "
            "started) and streams ended by a handoff.", ["result"],
            namespace=ns, registry=r)
        self.audio_messages = Counter(
            "front_audio_messages", "Front ends' audio messages to the engine's process by path (shared: the "
            "samples in the front end's shared-memory pipe; inline: in the message, when the pipe had no room, "
            "the engine thread being behind).", ["path"], namespace=ns, registry=r)
        self.loop_lag = Histogram(
            "event_loop_lag_seconds", "How late the event loops serving the streams woke from a 100-ms sleep "
            "(the front ends', or the daemon's own with --workers 0): every stream of a late loop waits as long "
            "(server/loop_watch.py).", namespace=ns, registry=r, buckets=_LAG_BUCKETS)
        self.front_cpu = Counter(
            "front_cpu_seconds", "CPU time of the front-end processes (user and system; none with --workers 0, "
            "where process_cpu_seconds_total is the daemon's).", namespace=ns, registry=r)
        # Recorded by connections: in a front-end process (`server/worker.py`) these are sent to
        # the engine's process, whose /metrics adds them to its own.
        self.front = (self.streams_active, self.connections, self.rejections, self.audio_seconds,
                      self.partial_latency, self.final_latency, self.backlog, self.endpoints, self.audio_messages,
                      self.loop_lag, self.front_cpu)
        self._remote: dict[int, list[Metric]] = {}
        self.set_graphs(False, False)
        self.set_attention("explicit")
        self.set_calls(0, (0, 0), (0, 0))
        for counter, labels in ((self.rejections, REJECTION_REASONS),
                                (self.resumes, RESUME_RESULTS),
                                (self.endpoints, ENDPOINT_RULES),
                                (self.backlog, BACKLOG_ACTIONS),
                                (self.audio_messages, AUDIO_PATHS),
                                (self.migrations, MIGRATION_RESULTS)):
            for label in labels:
                counter.labels(label)

    def set_model(self, model: str, device: str, dtype: str) -> None:
        """Publish ``streamd_model_info{model,device,dtype} 1`` (replacing the previous one)."""
        self.model_info.info({"model": model, "device": device, "dtype": dtype})

    def observe_migration(self, pause_s: float, recapture_s: float, gap_s: float | None) -> None:
        """Record a migration that happened (`gap_s` None: no step ran soon after it)."""
        self.migration_pause.observe(pause_s)
        self.migration_recapture.observe(recapture_s)
        if gap_s is not None:
            self.migration_gap.observe(gap_s)

    def set_graphs(self, encoder: bool, decoder: bool) -> None:
        """Whether the last step's encoder and decoder replayed CUDA graphs."""
        self.graphs_in_use.labels(part="encoder").set(encoder)
        self.graphs_in_use.labels(part="decoder").set(decoder)

    def set_attention(self, path: str) -> None:
        """How the last step attended (one of ATTENTION_PATHS)."""
        if path != self._attention_path:
            self._attention_path = path
            for p in ATTENTION_PATHS:
                self.attention.labels(path=p).set(p == path)

    def set_calls(self, calls: int, eager: tuple[int, int], padded: tuple[int, int] = (0, 0)) -> None:
        """The engine's totals so far (`Recognizer.calls`, `eager_calls`, `padded_calls`): the
        counters take the increase."""
        seen, self._calls_seen = self._calls_seen, (calls, *eager, *padded)
        for part, i in (("encoder", 1), ("decoder", 2)):
            eager_now, padded_now = self._calls_seen[i] - seen[i], self._calls_seen[i + 2] - seen[i + 2]
            self.engine_calls.labels(part=part, path="eager").inc(eager_now)
            self.engine_calls.labels(part=part, path="padded").inc(padded_now)
            self.engine_calls.labels(part=part, path="graphs").inc(calls - seen[0] - eager_now - padded_now)

    def count_endpoint(self, rule: EndpointRule) -> None:
        """An utterance ended by endpoint rule ``rule`` (also the ones without speech, never sent)."""
        self.endpoints.labels(rule=rule.value).inc()

    def observe_step(self, seconds: float, batch_size: int, chunk_seconds: float) -> None:
        """Record one decode step that advanced ``batch_size`` streams by ``chunk_seconds`` each."""
        self.step_seconds.observe(seconds)
        self.batch_size.observe(batch_size)
        self.realtime_factor.set(seconds / chunk_seconds)

    def front_snapshot(self) -> list[Metric]:
        """The connection-side families as they stand (plain data: they cross processes)."""
        return [family for metric in self.front for family in metric.collect()]

    def set_remote(self, source: int, families: list[Metric]) -> None:
        """The latest `front_snapshot()` of front-end process `source`, added at `render()`."""
        self._remote[source] = families

    def render(self) -> bytes:
        """The text exposition format; serve it with ``CONTENT_TYPE``."""
        if not self._remote:
            return generate_latest(self.registry)
        merged = CollectorRegistry(auto_describe=False)
        merged.register(_Sum(self.registry, [f for fams in self._remote.values() for f in fams]))
        return generate_latest(merged)


class _Sum:
    """`base`'s families with the samples of same-named `extra` families added (counters,
    histograms and the open-streams gauge: every family a front end sends is a sum)."""

    def __init__(self, base: CollectorRegistry, extra: list[Metric]) -> None:
        self.base, self.extra = base, extra

    def collect(self) -> Iterator[Metric]:
        by_name: dict[str, list[Metric]] = {}
        for family in self.extra:
            by_name.setdefault(family.name, []).append(family)
        for family in self.base.collect():
            samples = {(s.name, tuple(sorted(s.labels.items()))): s for s in family.samples}
            for other in by_name.get(family.name, ()):
                for s in other.samples:
                    if s.name.endswith("_created"):
                        continue
                    key = (s.name, tuple(sorted(s.labels.items())))
                    mine = samples.get(key)
                    samples[key] = s if mine is None else mine._replace(value=mine.value + s.value)
            family.samples = list(samples.values())
            yield family
