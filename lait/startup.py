"""Start-up work a lait process can leave out.

pyarrow checks whether pandas is installed the first time a process converts Python objects to
Arrow (`pa.array`, `Table.from_pylist`, every Parquet part lait writes): to tell a pandas Series
from a list, it imports pandas. On this 2-core machine that import costs 0.4-0.65 s, in every
process, although no lait stage hands pandas objects to pyarrow. For `lait download` it is paid
three times on the way to the first request (the command, then each fetcher process) and is
about a tenth of the processes' CPU time on 2,000 photos (`bench/download`).

`skip_pandas_probe` lets pyarrow's check fail once, quickly, so that pandas is never imported for
it. Nothing else changes: pandas can still be imported afterwards, and pyarrow's calls that need
pandas (`Table.to_pandas`, `Table.from_pandas`) import it and switch its pandas support back on.
What stays off until then is pyarrow recognising a pandas object passed to `pa.array`, which it
would convert as a plain sequence (NaN kept as a float, not a null). So only processes that never
see pandas objects call it: the fetcher processes (`lait.crawler.run`) and the stage 1 commands
when they are the process itself, not `main(argv)` called from another program.
"""

from __future__ import annotations

import sys


class _RefusePandas:
    """A finder that answers `import pandas` with ImportError (pyarrow's sign that it is absent)."""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas":
            raise ImportError("lait: pandas is not imported for pyarrow's check (lait.startup)")
        return None


def skip_pandas_probe() -> bool:
    """Have pyarrow settle its pandas check without importing pandas; True when it did.

    Does nothing where pandas is already imported (the check is then free) or pyarrow has already
    made it (its answer is kept for the process)."""
    if "pandas" in sys.modules:
        return False
    import pyarrow as pa

    finder = _RefusePandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([])  # the first conversion makes the check, once per process
    finally:
        sys.meta_path.remove(finder)
    return "pandas" not in sys.modules
