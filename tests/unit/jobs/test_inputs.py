"""Batch-job readers: JSONL, CSV, Parquet and image folders give the same rows, ids and counts."""

import base64

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from models.digits.samples import grid_png, held_out
from scripts.jobs.inputs import InputError, open_input

GRIDS = [[int(v) for v in grid.reshape(-1)] for grid in held_out(5)[0]]


def write_lines(path, lines):
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def test_jsonl_rows_keep_ids_and_default_to_the_line_number(tmp_path):
    path = write_lines(
        tmp_path / "in.jsonl",
        [
            orjson.dumps({"id": "a", "instance": GRIDS[0]}),
            orjson.dumps({"instance": GRIDS[1]}),
            b"",
            orjson.dumps({"id": 7, "instance": GRIDS[2]}),
        ],
    )
    source = open_input(path)
    rows = list(source.rows())
    assert source.format == "jsonl" and source.count() == 3
    assert [(r.index, r.id) for r in rows] == [(0, "a"), (1, 2), (2, 7)]
    assert [r.instance for r in rows] == GRIDS[:3]
    assert [r.id for r in source.rows(skip=2)] == [7]


def test_a_broken_jsonl_line_is_a_row_with_a_problem_not_the_end_of_the_job(tmp_path):
    path = write_lines(
        tmp_path / "in.jsonl",
        [orjson.dumps({"instance": GRIDS[0]}), b'{"instance": [1, 2', b"[1, 2]", orjson.dumps({"instance": GRIDS[1]})],
    )
    rows = list(open_input(path).rows())
    assert [r.problem is None for r in rows] == [True, False, False, True]
    assert rows[1].problem.startswith("line 2 is not valid JSON")
    assert "expected an object" in rows[2].problem
    assert rows[3].instance == GRIDS[1]


def test_csv_value_columns_make_one_list_per_row(tmp_path):
    header = "id," + ",".join(f"p{i}" for i in range(64))
    lines = [header] + [f"row-{n}," + ",".join(str(v) for v in grid) for n, grid in enumerate(GRIDS)]
    path = tmp_path / "in.csv"
    path.write_text("\n".join(lines) + "\n")
    source = open_input(path)
    rows = list(source.rows())
    assert source.count() == 5
    assert [r.id for r in rows] == [f"row-{n}" for n in range(5)]
    assert [r.instance for r in rows] == GRIDS


def test_csv_instance_column_holds_json_or_text(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text('instance\n"[1, 2, 3]"\n"plain text, with a comma"\n"{""b64"": ""AAAA""}"\n')
    rows = list(open_input(path).rows())
    assert [r.id for r in rows] == [1, 2, 3]
    assert [r.instance for r in rows] == [[1, 2, 3], "plain text, with a comma", {"b64": "AAAA"}]


def test_csv_rows_that_cannot_be_read_carry_their_problem(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("a,b\n1,2\n3\nx,4\n")
    rows = list(open_input(path).rows())
    assert rows[0].instance == [1, 2] and rows[0].problem is None
    assert "has 1 cells, the header has 2" in rows[1].problem
    assert "must be a number" in rows[2].problem


def test_parquet_list_column_and_value_columns(tmp_path):
    with_list = tmp_path / "list.parquet"
    pq.write_table(pa.table({"id": [10, 11, 12], "instance": GRIDS[:3]}), with_list)
    columns = tmp_path / "columns.parquet"
    pq.write_table(pa.table({f"p{i}": [grid[i] for grid in GRIDS[:3]] for i in range(64)}), columns)
    assert open_input(with_list).count() == 3
    assert [(r.id, r.instance.tolist()) for r in open_input(with_list).rows()] == list(zip([10, 11, 12], GRIDS[:3], strict=True))
    assert [(r.id, r.instance.tolist()) for r in open_input(columns).rows(skip=1)] == list(zip([2, 3], GRIDS[1:3], strict=True))


def test_parquet_numbers_come_as_numpy_rows_with_the_values_of_the_python_path(tmp_path):
    """Lists of numbers without nulls, as many per row, are read as rows of one array per record batch: the values
    (and whether they are ints or floats) the Python path gives, ids as written, line numbers where there are none."""
    floats = [[v + 0.5 for v in grid] for grid in GRIDS[:3]]
    cases = {
        "ints": (pa.table({"id": ["a", "b", "c"], "instance": GRIDS[:3]}), ["a", "b", "c"], GRIDS[:3], np.int64),
        "floats": (pa.table({"instance": floats}), [1, 2, 3], floats, np.float64),
        "fixed size": (
            pa.table({"instance": pa.array(GRIDS[:3], type=pa.list_(pa.int32(), 64))}),
            [1, 2, 3],
            GRIDS[:3],
            np.int32,
        ),
        "columns": (pa.table({f"p{i}": [grid[i] for grid in floats] for i in range(64)}), [1, 2, 3], floats, np.float64),
    }
    for name, (table, ids, values, dtype) in cases.items():
        path = tmp_path / f"{name}.parquet"
        pq.write_table(table, path)
        rows = list(open_input(path).rows())
        assert [r.id for r in rows] == ids, name
        assert all(isinstance(r.instance, np.ndarray) and r.instance.dtype == dtype for r in rows), name
        assert [r.instance.tolist() for r in rows] == values, name
        assert [type(v) for v in rows[0].instance.tolist()] == [type(v) for v in values[0]], name


@pytest.mark.parametrize(
    "table",
    [
        pa.table({"instance": [[1, 2], [3]]}),  # ragged
        pa.table({"instance": [[1, None], [3, 4]]}),  # a null value
        pa.table({"instance": [[1, 2], None]}),  # a null row
        pa.table({"instance": [[True, False], [False, True]]}),  # bools are not numbers
        pa.table({"instance": ["seven", "eight"]}),  # text
        pa.table({"a": [1, 2], "b": [0.5, 1.5]}),  # value columns of two types
        pa.table({"a": [1, None], "b": [2, 3]}),  # a null in a value column
    ],
)
def test_anything_else_in_parquet_is_read_as_python_values(tmp_path, table):
    path = tmp_path / "odd.parquet"
    pq.write_table(table, path)
    rows = list(open_input(path).rows())
    expected = table.column("instance").to_pylist() if "instance" in table.column_names else [[1, 2], [None, 3]]
    if "a" in table.column_names and table.column("a").null_count == 0:
        expected = [[1, 0.5], [2, 1.5]]
    assert [r.instance for r in rows] == expected
    assert not any(isinstance(r.instance, np.ndarray) for r in rows)


def test_image_folder_rows_are_base64_items_in_sorted_path_order(tmp_path):
    grids, _ = held_out(3)
    (tmp_path / "b").mkdir()
    files = {"b/2.png": grid_png(grids[2]), "a.png": grid_png(grids[0]), "b/1.png": grid_png(grids[1])}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "notes.txt").write_text("not an image")
    source = open_input(tmp_path)
    rows = list(source.rows())
    assert source.format == "images" and source.count() == 3
    assert [r.id for r in rows] == ["a.png", "b/1.png", "b/2.png"]
    assert [base64.b64decode(r.instance["b64"]) for r in rows] == [files[r.id] for r in rows]


def test_unknown_inputs_are_refused_with_the_allowed_formats(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        open_input(tmp_path / "missing.jsonl")
    (tmp_path / "data.xlsx").write_text("")
    with pytest.raises(InputError, match="use .jsonl, .csv, .parquet"):
        open_input(tmp_path / "data.xlsx")


@pytest.mark.parametrize(("size", "skip"), [(3000, 0), (3000, 4500), (4096, 1), (10_000, 0), (7, 9_995)])
def test_chunks_cut_the_rows_at_the_same_places_and_parquet_numbers_come_as_one_array(tmp_path, size, skip):
    """chunks(size, skip) holds what rows(skip) holds, cut every `size` rows, across Parquet's record batches (4,096
    rows) and row groups; numeric Parquet chunks carry their instances as one array equal to the rows' own."""
    grids = np.random.default_rng(0).integers(0, 17, (10_000, 64))
    numeric, text = tmp_path / "numeric.parquet", tmp_path / "text.jsonl"
    pq.write_table(pa.table({"id": [f"r{n}" for n in range(10_000)], "instance": grids.tolist()}), numeric, row_group_size=2_500)
    write_lines(text, [orjson.dumps({"id": f"r{n}", "instance": grid}) for n, grid in enumerate(grids[:50].tolist())])
    source = open_input(numeric)
    chunks = list(source.chunks(size, skip))
    rows = list(source.rows(skip))
    assert [len(chunk) for chunk in chunks] == [len(rows[i : i + size]) for i in range(0, len(rows), size)]
    assert [row.id for chunk in chunks for row in chunk.rows] == [row.id for row in rows]
    assert [row.index for chunk in chunks for row in chunk.rows] == list(range(skip, 10_000))
    starts = range(0, len(rows), size)
    for start, chunk in zip(starts, chunks, strict=True):
        assert chunk.instances is not None and chunk.instances.dtype == np.int64
        assert np.array_equal(chunk.instances, np.stack([row.instance for row in rows[start : start + size]]))
        assert [row.instance.tolist() for row in chunk.rows_with_instances()] == chunk.instances.tolist()
    assert np.array_equal(np.concatenate([chunk.instances for chunk in chunks]), grids[skip:])
    from_text = list(open_input(text).chunks(20, 5))
    assert [len(chunk) for chunk in from_text] == [20, 20, 5]
    assert all(chunk.instances is None for chunk in from_text)
    assert [row.id for chunk in from_text for row in chunk.rows] == [f"r{n}" for n in range(5, 50)]


def test_only_the_chunk_that_spans_a_batch_read_as_python_values_loses_its_array(tmp_path):
    """16,384 rows in record batches of 4,096, a null row at row 5,000: the chunks of 1,000 that hold rows of the
    second batch have no array (their rows hold their own instances), every other chunk keeps one."""
    values = [[n % 17] * 4 for n in range(16_384)]
    values[5_000] = None
    path = tmp_path / "null.parquet"
    pq.write_table(pa.table({"instance": values}), path, row_group_size=4096)
    chunks = list(open_input(path).chunks(1000))
    second_batch = {4, 5, 6, 7, 8}  # chunks holding rows 4,000-8,999 (the batch of rows 4,096-8,191)
    assert [chunk.instances is not None for chunk in chunks] == [n not in second_batch for n in range(17)]
    read = [row.instance for chunk in chunks for row in chunk.rows_with_instances()]
    assert [None if v is None else list(v) for v in read] == values


def test_a_chunk_joined_from_parts_of_other_kinds_has_no_array(tmp_path):
    """A chunk that spans a numeric record batch and one read as Python values (a null row) holds its rows' own
    instances only."""
    first = [[n] * 4 for n in range(4096)]
    path = tmp_path / "mixed.parquet"
    pq.write_table(pa.table({"instance": first + [None, [1, 2, 3, 4]]}), path, row_group_size=4096)
    chunks = list(open_input(path).chunks(4000))
    assert [len(chunk) for chunk in chunks] == [4000, 98]
    assert chunks[0].instances is not None and chunks[1].instances is None
    assert [
        row.instance if row.instance is None or isinstance(row.instance, list) else row.instance.tolist()
        for row in chunks[1].rows
    ][-3:] == [
        [4095] * 4,
        None,
        [1, 2, 3, 4],
    ]
