"""Rewrite the RECORD files of a virtual environment to the files as they now are.

Usage: ``python3 packaging/fix_record.py VENV`` (run by debian/rules after dh_strip).

pip writes each installed file's ``sha256=<urlsafe base64, no padding>`` and size into
``<dist>.dist-info/RECORD`` (the wheel RECORD format). The package build then changes
some files: install-venv rewrites the scripts' shebangs from the build path to
/usr/lib/hetpatrol, and dh_strip strips the extension modules. Left alone, those lines
would name hashes of files that never ship (and of the build path, so two builds in two
directories would differ). Lines without a hash (RECORD itself) and files that are gone
are kept as they are.
"""

import base64
import csv
import hashlib
import io
import sys
from pathlib import Path


def fix(record: Path) -> int:
    rows = list(csv.reader(io.StringIO(record.read_text())))
    changed = 0
    for row in rows:
        path = record.parent.parent / row[0]
        if len(row) != 3 or not row[1] or not path.is_file():
            continue
        data = path.read_bytes()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        new = ["sha256=" + digest.decode(), str(len(data))]
        if row[1:3] != new:
            row[1:3] = new
            changed += 1
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    record.write_text(out.getvalue())
    return changed


def main() -> None:
    venv = Path(sys.argv[1])
    records = sorted(venv.glob("lib/python3*/site-packages/*.dist-info/RECORD"))
    if not records:
        sys.exit(f"fix_record: no RECORD under {venv}")
    for record in records:
        changed = fix(record)
        if changed:
            print(f"fix_record: {record.parent.name}: {changed} lines")


if __name__ == "__main__":
    main()
