"""The store keeps each table's primary-key values in row order (integer and string keys)."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from confluence.preprocess.pipeline import preprocess
from confluence.store import Store
from tests.fixtures.bookstore import HashEncoder, bookstore_files


def test_primary_key_values_round_trip(tmp_path):
    src, meta = bookstore_files(tmp_path)
    store = Store.open(preprocess(src, meta, tmp_path / "store", encoder=HashEncoder(8), progress=False))
    for table in store.tables:
        keys = store.keys(table.name)
        if table.primary_key is None:
            assert keys is None
            continue
        raw = pq.read_table(src / f"{table.name}.parquet").column(table.primary_key).to_pylist()
        assert keys.to_pylist() == [k if isinstance(k, str) else int(k) for k in raw], table.name
        assert len(keys) == table.num_rows
    books = store.keys("books")
    assert books.type.equals(pa.string())
    assert np.asarray(store.keys("orders")).dtype == np.int64
