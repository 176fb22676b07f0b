"""``Job.to_parquet``: a job's results as a Parquet file (``id``, ``vector``, ``tokens``).

The client library opens and checks the results into its ``{"id", "embedding", "tokens"}``
lines (the only form carrying each record's token count), written only if every check passes;
pyarrow reads those lines block by block into the Parquet writer, so memory stays at one block
whatever the job's size. pyarrow is an optional extra (``pip install ephem-batch[parquet]``)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Dict, Union

from .errors import NotAvailableError

if TYPE_CHECKING:  # pragma: no cover
    from . import Job

#: Bytes of JSON lines pyarrow parses at a time (about 900 vectors of 384 dimensions), on one
#: thread: a threaded reader parses blocks ahead and holds them.
BLOCK_BYTES = 4 << 20


def write_parquet(job: "Job", path: Union[str, "os.PathLike[str]"], compression: str = "zstd") -> Dict[str, Any]:
    try:
        import pyarrow as pa
        import pyarrow.json as pj
        import pyarrow.parquet as pq
    except ImportError:
        raise NotAvailableError("to_parquet needs pyarrow: pip install 'ephem-batch[parquet]'") from None
    if not hasattr(pj, "open_json"):
        raise NotAvailableError(f"to_parquet needs pyarrow >= 19 (pyarrow.json.open_json); this is {pa.__version__}")

    directory = os.path.join(job._client.home, "client", "jobs", job.id)
    lines = os.path.join(directory, "parquet-source.jsonl")
    written = json.loads(job._client._native.results(job.id, lines, "jsonl"))
    errors = written["errors"]
    try:
        dimensions = int(written["summary"].get("dimensions") or 0)
        source_schema = pa.schema(
            [("id", pa.string()), ("embedding", pa.list_(pa.float32())), ("tokens", pa.int64())]
        )
        vector = pa.list_(pa.float32(), dimensions) if dimensions else pa.list_(pa.float32())
        schema = pa.schema([("id", pa.string()), ("vector", vector), ("tokens", pa.int64())]).with_metadata(
            {
                b"ephem_batch.job_id": job.id.encode(),
                b"ephem_batch.model": str(job.record.get("model_id", "")).encode(),
            }
        )
        rows = 0
        target = os.fspath(path)
        with pq.ParquetWriter(target, schema, compression=compression) as out:
            if os.path.getsize(lines) > 0:
                reader = pj.open_json(
                    lines,
                    read_options=pj.ReadOptions(block_size=BLOCK_BYTES, use_threads=False),
                    parse_options=pj.ParseOptions(explicit_schema=source_schema, unexpected_field_behavior="ignore"),
                )
                for batch in reader:
                    columns = [batch.column("id"), batch.column("embedding").cast(vector), batch.column("tokens")]
                    out.write_batch(pa.RecordBatch.from_arrays(columns, schema=schema))
                    rows += batch.num_rows
    finally:
        # The plaintext lines were only the way in; the checked npy of results() stays.
        for leftover in (lines, errors):
            try:
                os.remove(leftover)
            except FileNotFoundError:
                pass
    return {"path": target, "rows": rows, "dimensions": dimensions}
