"""The input of a Ray batch job (scripts/jobs/ray_runner.py) as a Ray Data source: one block per chunk of rows.

A module of its own so that the read task's worker imports the job's readers only, not torch and the handler.
"""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from scripts.jobs.inputs import RowSource

CHUNK = "chunk"


class ChunkSource(Datasource):
    """The job's input from its first uncommitted row, one chunk of Rows per block, read in order by one task."""

    def __init__(self, source: RowSource, skip: int, total: int, chunk_size: int) -> None:
        super().__init__()
        self.source, self.skip, self.total, self.chunk_size = source, skip, total, chunk_size

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None, data_context=None) -> list[ReadTask]:
        # One reader, whatever the parallelism asked for: rows come strictly in order, each read once.
        metadata = BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None, input_files=[str(self.source.path)])
        return [ReadTask(self._blocks, metadata, per_task_row_limit=per_task_row_limit)]

    def _blocks(self) -> Iterator[pd.DataFrame]:
        for chunk in self.source.chunks(self.chunk_size, self.skip):
            # The chunk is one row of the dataset (a list of Rows, pickled as a Python object).
            yield pd.DataFrame({CHUNK: pd.Series([chunk.rows_with_instances()], dtype=object)})
