"""Scrape-time collectors: build Prometheus families from recorder state and read hardware."""

from __future__ import annotations

import os
import threading

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily

from .catalogue import BY_NAME, Metric
from .recorder import Recorder


def _family(metric: Metric, labels=None):
    labels = list(metric.labels if labels is None else labels)
    if metric.kind == "counter":
        return CounterMetricFamily(metric.name.removesuffix("_total"), metric.help, labels=labels)
    if metric.kind == "gauge":
        return GaugeMetricFamily(metric.name, metric.help, labels=labels)
    if metric.kind == "info":
        return InfoMetricFamily(metric.name.removesuffix("_info"), metric.help, labels=[])
    raise ValueError(metric.kind)


class CatalogueCollector:
    """Every catalogued metric the recorder holds, at the recorder's level."""

    def __init__(self, recorder: Recorder, extra_labels: dict[str, str] | None = None):
        self.recorder = recorder
        self.extra = dict(extra_labels or {})

    def describe(self):
        return []  # families are built at scrape time only

    def collect(self):
        values, histograms, info = self.recorder.snapshot()
        by_metric: dict[str, list] = {}
        for (name, labels), value in values.items():
            by_metric.setdefault(name, []).append((labels, value))
        ex_names, ex_values = list(self.extra), list(self.extra.values())
        for metric in self.recorder.metrics:
            if metric.hardware or metric.component in ("process", "node"):
                continue  # SystemCollector reads these at scrape time
            if metric.kind == "info":
                fam = _family(metric)
                fam.add_metric([], {**info, **self.extra})
                yield fam
            elif metric.kind == "histogram":
                bounds, counts, total = histograms[metric.name]
                cumulative = counts.cumsum()
                buckets = [(_le(b), float(c)) for b, c in zip(bounds, cumulative[:-1], strict=True)]
                buckets.append(("+Inf", float(cumulative[-1])))
                fam = HistogramMetricFamily(metric.name, metric.help, labels=ex_names)
                fam.add_metric(ex_values, buckets, total)
                yield fam
            else:
                fam = _family(metric, list(metric.labels) + ex_names)
                for labels, value in sorted(by_metric.get(metric.name, [])):
                    fam.add_metric(list(labels) + ex_values, value)
                yield fam


def _le(bound: float) -> str:
    return repr(float(bound))


class SystemCollector:
    """Process memory and CPU, torch CUDA memory, and NVML GPU vitals, read when scraped.

    A missing GPU, a missing NVML library or a field the GPU does not report
    gives an empty family (the metric is declared, with no samples), never an error.
    """

    def __init__(self, recorder: Recorder, extra_labels: dict[str, str] | None = None):
        self.recorder = recorder
        self.extra = dict(extra_labels or {})
        self.process = psutil.Process(os.getpid())
        self._nvml = None
        self._nvml_lock = threading.Lock()

    def describe(self):
        return []

    def _wanted(self, name: str) -> Metric | None:
        return BY_NAME[name] if name in self.recorder.enabled else None

    def collect(self):
        ex_names, ex_values = list(self.extra), list(self.extra.values())
        m = self._wanted("rlvitals_process_resident_memory_bytes")
        if m:
            fam = _family(m, ex_names)
            fam.add_metric(ex_values, float(self.process.memory_info().rss))
            yield fam
        m = self._wanted("rlvitals_process_cpu_seconds_total")
        if m:
            t = self.process.cpu_times()
            fam = _family(m, ex_names)
            fam.add_metric(ex_values, float(t.user + t.system))
            yield fam
        m = self._wanted("rlvitals_node_memory_used_bytes")
        if m:
            vm = psutil.virtual_memory()
            fam = _family(m, ex_names)
            fam.add_metric(ex_values, float(vm.total - vm.available))
            yield fam
            total = _family(BY_NAME["rlvitals_node_memory_total_bytes"], ex_names)
            total.add_metric(ex_values, float(vm.total))
            yield total
        m = self._wanted("rlvitals_node_cpu_utilization_ratio")
        if m:
            fam = _family(m, ex_names)
            fam.add_metric(ex_values, psutil.cpu_percent(interval=None) / 100.0)
            yield fam
        yield from self._torch(ex_names, ex_values)
        yield from self._gpu(ex_names, ex_values)

    def _torch(self, ex_names, ex_values):
        names = ("rlvitals_torch_memory_allocated_bytes", "rlvitals_torch_memory_reserved_bytes",
                 "rlvitals_torch_memory_peak_allocated_bytes", "rlvitals_torch_memory_peak_reserved_bytes")
        wanted = [self._wanted(n) for n in names]
        if not any(wanted):
            return
        fams = [_family(m, list(m.labels) + ex_names) if m else None for m in wanted]
        import sys

        torch = sys.modules.get("torch")  # only report for processes that already use torch
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            for i in range(torch.cuda.device_count()):
                readings = (torch.cuda.memory_allocated(i), torch.cuda.memory_reserved(i),
                            torch.cuda.max_memory_allocated(i), torch.cuda.max_memory_reserved(i))
                for fam, value in zip(fams, readings, strict=True):
                    if fam is not None:
                        fam.add_metric([str(i)] + ex_values, float(value))
        yield from (f for f in fams if f is not None)

    def _nvml_handle_count(self):
        with self._nvml_lock:
            if self._nvml is None:
                try:
                    import pynvml

                    pynvml.nvmlInit()
                    self._nvml = pynvml
                except Exception:  # no driver, no library, no GPU: all the same to us
                    self._nvml = False
            if not self._nvml:
                return None, 0
            try:
                return self._nvml, self._nvml.nvmlDeviceGetCount()
            except Exception:
                return None, 0

    def _gpu(self, ex_names, ex_values):
        names = ("rlvitals_gpu_memory_used_bytes", "rlvitals_gpu_memory_total_bytes",
                 "rlvitals_gpu_utilization_ratio", "rlvitals_gpu_temperature_celsius",
                 "rlvitals_gpu_power_watts", "rlvitals_gpu_fan_ratio")
        wanted = [self._wanted(n) for n in names]
        if not any(wanted):
            return
        fams = {n: _family(m, list(m.labels) + ex_names) for n, m in zip(names, wanted, strict=True) if m}
        nvml, count = self._nvml_handle_count()
        for i in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
            except Exception:
                continue
            readers = {
                "rlvitals_gpu_memory_used_bytes": lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used,
                "rlvitals_gpu_memory_total_bytes": lambda h: nvml.nvmlDeviceGetMemoryInfo(h).total,
                "rlvitals_gpu_utilization_ratio": lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
                "rlvitals_gpu_temperature_celsius":
                    lambda h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
                "rlvitals_gpu_power_watts": lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
                "rlvitals_gpu_fan_ratio": lambda h: nvml.nvmlDeviceGetFanSpeed(h) / 100.0,
            }
            for name, fam in fams.items():
                try:
                    fam.add_metric([str(i)] + ex_values, float(readers[name](handle)))
                except Exception:  # field not supported on this GPU (fans on data-centre cards)
                    continue
        yield from fams.values()
