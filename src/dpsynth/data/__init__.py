"""Load private text data (CSV, JSON Lines, Parquet) and validate it with clear errors.

A private data set is one text column, zero or more label columns and, optionally, a user
column (the unit of privacy when one person wrote several records). :func:`load_dataset`
returns a :class:`Dataset` or raises :class:`DataError` listing *every* problem found (not
just the first); :func:`check_dataset` returns the same problems plus a summary without
raising, for ``dpsynth data check``.

Row numbers in problems are 1-based **data rows**:

- CSV and Parquet: row 1 is the first record after the header (the header is not counted).
  For a CSV file without multi-line fields, data row ``n`` sits on file line ``n + 1``.
- JSON Lines: the row is the **file line number** (blank lines are skipped but counted), so
  an editor's "go to line" finds it. A ``.json`` file holding one JSON array is accepted
  too; its rows are the 1-based array positions.

The file is streamed (:data:`CHUNK_ROWS` records at a time; only a ``.json`` array is parsed
whole): each chunk is validated and its texts appended to a private memory-mapped Arrow file
(:mod:`dpsynth.columns`), so the texts never sit in memory; labels and users are kept as int32
codes. Duplicates are found across chunks by a 64-bit hash of text and labels, confirmed by
comparing the records. :meth:`Dataset.fingerprint` reads the texts back in chunks and gives the
same digest as the whole-file loader did.

Private text never appears in a problem message: a message about a cell names the file, the
row, the field and the cell's length only.

The label domain is public input (docs/methods.md §0): ``label_values`` (from the config's
``data.label_values``) lists each label column's values, a record holding another value is an
error naming its row, and :meth:`Dataset.joint_label_codes` builds the classes as the product of
the declared values, so a declared class that no record holds still exists. Nothing about the
classes is derived from the records.

Values are read as strings: CSV cells are taken verbatim (``"NA"`` is a label, not a missing
value); in JSON and Parquet, numbers and booleans in label or user columns are converted to
strings (``4.0`` becomes ``"4"``), ``null``/NaN is a missing value.
"""

from __future__ import annotations

from .check import CheckReport, check_dataset
from .dataset import (
    MAX_JOINT_CLASSES,
    Dataset,
    check_label_values,
    label_classes,
    no_domain_message,
    take_rows,
)
from .fingerprint import Fingerprint, fingerprint_columns
from .loading import ON_DUPLICATE, load_dataset
from .problems import MAX_LISTED, DataError, DataProblem
from .readers import CHUNK_ROWS, SUPPORTED_SUFFIXES

__all__ = [
    "CHUNK_ROWS",
    "MAX_JOINT_CLASSES",
    "MAX_LISTED",
    "ON_DUPLICATE",
    "SUPPORTED_SUFFIXES",
    "CheckReport",
    "DataError",
    "DataProblem",
    "Dataset",
    "Fingerprint",
    "check_dataset",
    "check_label_values",
    "fingerprint_columns",
    "label_classes",
    "load_dataset",
    "no_domain_message",
    "take_rows",
]
