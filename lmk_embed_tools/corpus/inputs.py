"""The corpus to encode: which files, their rows, and a check of every row before any encoding.

INPUT is a glob of jsonl, csv or parquet files, or a folder written by `datasets`'
`save_to_disk`. A row is `(id, text)`, read from `id_field` and `text_field`. Every problem is
a `CorpusInputError` that names the file, the line (jsonl, csv) or row (parquet, datasets) and
the field. csv values are strings (ids too); jsonl, parquet and datasets keep integer ids. Ids
are unique across INPUT: a repeated id is refused, naming both places. Rows are numbered globally
in input order (files sorted by name); shards are ranges of these numbers.
"""

from __future__ import annotations

import csv
import glob
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lmk_embed_tools.compat import dataset_fingerprint

from .shards import update_digest

FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}
_DATASETS_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


class CorpusInputError(ValueError):
    """A problem with INPUT, a file of it or one of its rows; the message names where."""


@dataclass
class Source:
    """One input file (or one saved `datasets` dataset) and what the check found in it."""

    path: str
    format: str  # jsonl | csv | parquet | datasets
    rows: int = 0
    fingerprint: str = ""  # sha256 of the file's bytes; the dataset's own fingerprint for `datasets`


def resolve_sources(spec: str) -> list[Source]:
    """INPUT -> its sources, sorted by path so that row numbers never depend on the file system."""
    spec = os.fspath(spec)
    if os.path.isdir(spec):
        if any(os.path.isfile(os.path.join(spec, marker)) for marker in _DATASETS_MARKERS):
            return [Source(spec, "datasets")]
        raise CorpusInputError(f"INPUT {spec!r} is a folder but not a saved `datasets` dataset; give a glob such as "
                               f"'{spec}/*.jsonl'")
    paths = sorted(p for p in glob.glob(spec, recursive=True) if os.path.isfile(p))
    if not paths:
        raise CorpusInputError(f"INPUT {spec!r} matches no file")
    sources = []
    for path in paths:
        kind = FORMATS.get(Path(path).suffix.lower())
        if kind is None:
            raise CorpusInputError(f"{path}: unknown format {Path(path).suffix!r}; expected one of {sorted(FORMATS)}")
        if not os.access(path, os.R_OK):
            raise CorpusInputError(f"{path}: cannot read the file (permission denied)")
        sources.append(Source(path, kind))
    return sources


def _check_row(source: Source, where: str, row, text_field: str, id_field: str, path_field: str | None = None):
    """(id, text) of one row, or a CorpusInputError naming the file, `where` (line/row) and field.

    With `path_field`, the row names a UTF-8 text file (relative to the input file's folder) and
    the text is that file, returned as a `pathlib.Path` (streamed by models that can stream).
    """
    if not isinstance(row, dict):
        raise CorpusInputError(f"{source.path}, {where}: expected an object with fields, got {type(row).__name__}")
    if path_field is not None:
        text_field = path_field
    flags = {id_field: "--id-field", text_field: "--path-field" if path_field else "--text-field"}
    for field, flag in flags.items():
        if row.get(field) is None:
            state = "is null" if field in row else "is missing"
            raise CorpusInputError(f"{source.path}, {where}: field {field!r} ({flag}) {state}; "
                                   f"fields present: {sorted(row)}")
    text, row_id = row[text_field], row[id_field]
    if not isinstance(text, str):
        raise CorpusInputError(f"{source.path}, {where}: field {text_field!r} must be a string, "
                               f"got {type(text).__name__} {text!r:.60}")
    if path_field is not None:
        folder = source.path if source.format == "datasets" else os.path.dirname(source.path)
        path = Path(folder, text)
        if not path.is_file():
            raise CorpusInputError(f"{source.path}, {where}: field {path_field!r} names {text!r}, which is not a file "
                                   f"(paths are relative to {folder or '.'!r})")
        text = path
    if isinstance(row_id, bool) or not isinstance(row_id, (str, int)):
        raise CorpusInputError(f"{source.path}, {where}: field {id_field!r} must be a string or an integer, "
                               f"got {type(row_id).__name__} {row_id!r:.60}")
    return row_id, text


def _jsonl_rows(source: Source) -> Iterator[tuple[str, object]]:
    # Binary lines decoded one by one, so a decoding error names its line.
    with open(source.path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            where = f"line {number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise CorpusInputError(f"{source.path}, {where}: not UTF-8 ({error.reason})") from None
            if not line.strip():
                continue  # a blank line is no row
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as error:
                raise CorpusInputError(f"{source.path}, {where}: not valid JSON ({error.msg})") from None


def _csv_rows(source: Source) -> Iterator[tuple[str, object]]:
    with open(source.path, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        try:
            header = next(reader, None)
            if header is None:
                return
            start = reader.line_num + 1
            for values in reader:
                where = f"line {start}"
                if len(values) > len(header):
                    raise CorpusInputError(f"{source.path}, {where}: {len(values)} values for {len(header)} columns")
                # A short row leaves its last fields missing, as csv.DictReader does (None).
                yield where, dict(zip(header, values))
                start = reader.line_num + 1
        except UnicodeDecodeError as error:
            raise CorpusInputError(f"{source.path}, near line {reader.line_num + 1}: not UTF-8 ({error.reason})") from None
        except csv.Error as error:
            raise CorpusInputError(f"{source.path}, line {reader.line_num}: bad CSV ({error})") from None


def _parquet_rows(source: Source, columns: list[str], skip: int = 0) -> Iterator[tuple[str, object]]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(source.path)
    except Exception as error:  # pyarrow raises ArrowInvalid / OSError for a file that is not parquet
        raise CorpusInputError(f"{source.path}: cannot read as parquet ({error})") from None
    names = parquet.schema_arrow.names
    present = [c for c in columns if c in names]  # a missing column is reported per row, naming the field
    number = 0
    for group in range(parquet.num_row_groups):
        size = parquet.metadata.row_group(group).num_rows
        if number + size <= skip:  # whole row groups before the shard are never read
            number += size
            continue
        for row in parquet.read_row_group(group, columns=present).to_pylist():
            number += 1
            yield f"row {number}", row


def _datasets_rows(source: Source, columns: list[str], skip: int = 0) -> Iterator[tuple[str, object]]:
    dataset = load_saved_dataset(source.path)
    present = [c for c in columns if c in dataset.column_names]
    dataset = dataset.select_columns(present)
    for offset, row in enumerate(dataset.select(range(skip, len(dataset)))):
        yield f"row {skip + offset + 1}", row


def load_saved_dataset(path: str):
    """A `datasets.Dataset` saved with `save_to_disk`; a DatasetDict must be narrowed to one split."""
    import datasets

    try:
        loaded = datasets.load_from_disk(path)
    except Exception as error:
        raise CorpusInputError(f"{path}: cannot load as a saved `datasets` dataset ({error})") from None
    if isinstance(loaded, datasets.DatasetDict):
        raise CorpusInputError(f"{path} holds the splits {sorted(loaded)}; give one split's folder, e.g. "
                               f"'{os.path.join(path, sorted(loaded)[0])}'")
    return loaded


def iter_source(source: Source, text_field: str, id_field: str, skip: int = 0,
                path_field: str | None = None) -> Iterator[tuple[str, object, str]]:
    """(where, id, text) of every row of `source` from row `skip` on, each checked; `where` is
    "line N" (jsonl, csv) or "row N" (parquet, datasets)."""
    columns = [id_field, path_field or text_field]
    if source.format == "jsonl":
        rows = _jsonl_rows(source)
    elif source.format == "csv":
        rows = _csv_rows(source)
    elif source.format == "parquet":
        rows = _parquet_rows(source, columns, skip)
    else:
        rows = _datasets_rows(source, columns, skip)
    position = 0
    for where, row in rows:
        if source.format in ("parquet", "datasets"):
            position = int(where.split()[1])  # these readers skip by themselves
        else:
            position += 1
        if position <= skip:
            continue  # jsonl and csv lines are counted, not parsed as rows of the shard
        yield (where, *_check_row(source, where, row, text_field, id_field, path_field))


def _fingerprint(source: Source, referenced=None) -> str:
    """sha256 of the file (or the dataset's own fingerprint), plus that of the text files its rows
    name (`referenced`: their digest), so that a changed document is a changed input."""
    if source.format == "datasets":
        own = "datasets:" + dataset_fingerprint(load_saved_dataset(source.path))
    else:
        digest = hashlib.sha256()
        update_digest(digest, source.path)
        own = "sha256:" + digest.hexdigest()
    return own if referenced is None else f"{own}+files:{referenced.hexdigest()}"


def is_blank_file(path: Path) -> bool:
    """An empty text file, or a small one of whitespace only (large files are not read for this)."""
    size = path.stat().st_size
    return size == 0 or (size <= 1 << 20 and not path.read_bytes().decode("utf-8", "replace").strip())


def check_sources(sources: list[Source], text_field: str, id_field: str, path_field: str | None = None) -> dict:
    """Read every row once: check it, count rows per source, and fingerprint each source.

    Returns {"rows": N, "empty": rows whose text is blank, "id_type": "str" | "int"}. Mixed id types
    are an error (the `id` column has one type), named at the first row that differs. So is an id
    that occurs twice (two vectors would answer to one id), named with both places: only the set
    of ids is held, and the first place is found by reading again up to it.
    """
    total = empty = 0
    id_type = None
    seen = set()
    for source in sources:
        source.rows = 0
        referenced = hashlib.sha256() if path_field else None
        try:
            for where, row_id, text in iter_source(source, text_field, id_field, path_field=path_field):
                kind = "int" if isinstance(row_id, int) else "str"
                if id_type is None:
                    id_type, first = kind, f"{source.path}, {where}"
                elif kind != id_type:
                    raise CorpusInputError(
                        f"{source.path}, {where}: field {id_field!r} is {kind} but the first row ({first}) has "
                        f"{id_type}; ids must all be strings or all integers")
                if row_id in seen:
                    first_place = _first_place(sources, row_id, text_field, id_field, path_field)
                    raise CorpusInputError(
                        f"{source.path}, {where}: duplicate id {row_id!r} in field {id_field!r} (--id-field), first at "
                        f"{first_place}; ids must be unique")
                seen.add(row_id)
                if isinstance(text, Path):
                    try:
                        update_digest(referenced, text)
                    except OSError as error:
                        raise CorpusInputError(f"{source.path}, {where}: cannot read {str(text)!r} "
                                               f"({error.strerror or error})") from None
                    empty += is_blank_file(text)
                else:
                    empty += not text.strip()
                source.rows += 1
        except OSError as error:
            raise CorpusInputError(f"{source.path}: cannot read the file ({error.strerror or error})") from None
        source.fingerprint = _fingerprint(source, referenced)
        total += source.rows
    return {"rows": total, "empty": empty, "id_type": id_type or "str"}


def _first_place(sources: list[Source], row_id, text_field: str, id_field: str, path_field: str | None) -> str:
    """"file, line N" (or row N) of the first row whose id is `row_id`."""
    for source in sources:
        for where, other, _ in iter_source(source, text_field, id_field, path_field=path_field):
            if other == row_id:
                return f"{source.path}, {where}"
    raise AssertionError(f"id {row_id!r} was seen but is not found again")  # pragma: no cover - INPUT changed under us


def read_range(sources: list[Source], start: int, stop: int, text_field: str, id_field: str,
               path_field: str | None = None) -> tuple[list, list]:
    """(ids, texts) of global rows [start, stop), in input order; texts are `Path`s with `path_field`."""
    ids, texts = [], []
    offset = 0
    for source in sources:
        if offset + source.rows <= start:
            offset += source.rows
            continue
        for _, row_id, text in iter_source(source, text_field, id_field, skip=max(start - offset, 0),
                                           path_field=path_field):
            if len(ids) == stop - start:
                break
            ids.append(row_id)
            texts.append(text)
        offset += source.rows
        if offset >= stop:
            break
    if len(ids) != stop - start:
        raise CorpusInputError(f"INPUT changed while encoding: rows {start}..{stop} are no longer all there")
    return ids, texts
