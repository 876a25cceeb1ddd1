"""CUDA graphs for a stream lane: which bucket a batch is padded up to (pure, tested on the CPU) and the forward
pass captured once per bucket, replayed from static pinned buffers with one synchronisation per batch.

A small model's call on a GPU is mostly host overhead (launching each kernel, docs/gpu.md); a replayed graph
launches them all at once. Shapes are fixed per graph, so a batch is padded up to the smallest bucket that holds
it: rows with zero images (digits) or fully masked tokens (text, which leave the real rows' embeddings as they
are), and anything larger than the largest bucket runs eagerly."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)

SHORTEST_SEQUENCE_BUCKET = 16
WARMUP_CALLS = 3  # before a capture, on a side stream: cuBLAS/cuDNN pick their kernels and workspaces


@dataclass(frozen=True)
class Bucket:
    rows: int
    length: int | None = None  # padded sequence length (text), None for fixed-size inputs

    def __str__(self) -> str:
        return f"{self.rows}x{self.length}" if self.length is not None else str(self.rows)


def batch_buckets(max_rows: int) -> tuple[int, ...]:
    """1, 2, 4, ... below `max_rows`, then `max_rows` itself (a lane's batchSize need not be a power of two)."""
    if not isinstance(max_rows, int) or isinstance(max_rows, bool) or max_rows < 1:
        raise ValueError(f"the largest batch bucket must be a positive integer, got {max_rows!r}")
    sizes, size = [], 1
    while size < max_rows:
        sizes.append(size)
        size *= 2
    return (*sizes, max_rows)


def sequence_buckets(max_seq_length: int) -> tuple[int, ...]:
    """The default text buckets: 16, 32, 64, ... below max_seq_length, then max_seq_length."""
    if max_seq_length <= SHORTEST_SEQUENCE_BUCKET:
        return (max_seq_length,)
    lengths, length = [], SHORTEST_SEQUENCE_BUCKET
    while length < max_seq_length:
        lengths.append(length)
        length *= 2
    return (*lengths, max_seq_length)


def smallest_fitting(value: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket >= value, None above the largest."""
    return next((bucket for bucket in buckets if bucket >= value), None)


def choose(rows: int, length: int | None, row_buckets: Sequence[int], length_buckets: Sequence[int] | None) -> Bucket | None:
    """The bucket a batch of `rows` rows (of padded `length` tokens for text) replays in; None: run it eagerly."""
    fitted_rows = smallest_fitting(rows, row_buckets)
    if fitted_rows is None:
        return None
    if length is None or length_buckets is None:
        return Bucket(fitted_rows)
    fitted_length = smallest_fitting(length, length_buckets)
    return Bucket(fitted_rows, fitted_length) if fitted_length is not None else None


def all_buckets(row_buckets: Sequence[int], length_buckets: Sequence[int] | None) -> list[Bucket]:
    if length_buckets is None:
        return [Bucket(rows) for rows in row_buckets]
    return [Bucket(rows, length) for rows in row_buckets for length in length_buckets]


def batch_shape(batch: Any) -> tuple[int, int | None]:
    """(rows, sequence length or None) of a collated batch: a tensor, or a dict of (rows, length) tensors."""
    if isinstance(batch, dict):
        rows, length = next(iter(batch.values())).shape[:2]
        return int(rows), int(length)
    return int(batch.shape[0]), None


def pad_batch(batch: Any, bucket: Bucket) -> Any:
    """`batch` padded up to `bucket` on the CPU. Images: zero rows. Text: padding tokens masked out (ids 0), and a
    padding row attends to its first token only, so no row is fully masked (as the text task's collate does)."""
    if not isinstance(batch, dict):
        rows = batch.shape[0]
        if rows == bucket.rows:
            return batch
        padding = torch.zeros((bucket.rows - rows, *batch.shape[1:]), dtype=batch.dtype)
        return torch.cat([batch, padding])
    rows, length = batch_shape(batch)
    target_length = bucket.length if bucket.length is not None else length
    padded = {}
    for key, tensor in batch.items():
        out = torch.zeros((bucket.rows, target_length), dtype=tensor.dtype)
        out[:rows, :length] = tensor
        padded[key] = out
    if "attention_mask" in padded:
        padded["attention_mask"][rows:, 0] = 1
    return padded


class GraphRunner:
    """One model's forward pass captured per bucket on one CUDA device (capture on the thread that will replay:
    TorchServe's worker runs the handler on one thread). replay() returns None for a batch no bucket holds."""

    def __init__(self, forward, device: torch.device, buckets: Sequence[Bucket], example: Any, input_dtype=None) -> None:
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        self.forward = forward
        self.device = device
        self.input_dtype = input_dtype
        self.row_buckets = tuple(sorted({bucket.rows for bucket in buckets}))
        lengths = sorted({bucket.length for bucket in buckets if bucket.length is not None})
        self.length_buckets = tuple(lengths) if lengths else None
        self.graphs: dict[Bucket, _Captured] = {}
        self.pool = None
        before = torch.cuda.memory_reserved(device)
        # Largest first: the shared pool is sized by the first capture, the smaller ones reuse its blocks.
        for bucket in sorted(buckets, key=lambda b: (b.rows, b.length or 0), reverse=True):
            self.graphs[bucket] = self._capture(bucket, pad_batch(example, bucket))
        self.memory_bytes = torch.cuda.memory_reserved(device) - before

    def _on_device(self, batch: Any) -> Any:
        def move(tensor: torch.Tensor) -> torch.Tensor:
            tensor = tensor.to(self.device)
            return tensor.to(self.input_dtype) if self.input_dtype is not None and tensor.is_floating_point() else tensor

        return {key: move(value) for key, value in batch.items()} if isinstance(batch, dict) else move(batch)

    def _capture(self, bucket: Bucket, example: Any) -> _Captured:
        static_in = self._on_device(example)
        host_in = {k: v.pin_memory() for k, v in example.items()} if isinstance(example, dict) else example.pin_memory()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.inference_mode(), torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                self.forward(static_in)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the worker's other threads (the metrics collector) may call CUDA while this one captures.
        with torch.inference_mode(), torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            static_out = self.forward(static_in).float()
        self.pool = graph.pool()
        host_out = torch.empty(static_out.shape, dtype=static_out.dtype, pin_memory=True)
        return _Captured(graph, static_in, host_in, static_out, host_out, torch.cuda.Event())

    def replay(self, batch: Any) -> torch.Tensor | None:
        """The outputs of `batch` (a collated CPU batch) for its rows, on the CPU, or None when no bucket holds it.
        The copies in and out are queued around the replay; the one wait is on the event after the copy out."""
        rows, length = batch_shape(batch)
        bucket = choose(rows, length, self.row_buckets, self.length_buckets)
        if bucket is None:
            return None
        captured = self.graphs[bucket]
        padded = pad_batch(batch, bucket)
        if isinstance(padded, dict):
            for key, tensor in padded.items():
                captured.host_in[key].copy_(tensor)
                captured.static_in[key].copy_(captured.host_in[key], non_blocking=True)
        else:
            captured.host_in.copy_(padded)
            captured.static_in.copy_(captured.host_in, non_blocking=True)
        captured.graph.replay()
        captured.host_out.copy_(captured.static_out, non_blocking=True)
        captured.done.record()
        captured.done.synchronize()
        return captured.host_out[:rows].clone()


@dataclass
class _Captured:
    graph: Any  # torch.cuda.CUDAGraph
    static_in: Any  # device tensors the graph reads
    host_in: Any  # pinned host tensors of the same shapes
    static_out: torch.Tensor  # the device tensor the graph writes
    host_out: torch.Tensor  # pinned, for the copy back
    done: Any  # torch.cuda.Event after the copy back
