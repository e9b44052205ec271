"""A user's script that leaves objects for the interpreter's exit to finalize, as ``python
script.py`` would: a gzip file and a zip archive never closed (their trailer and central directory
are written when they are finalized), and an object of its own with a finalizer.

argv: OUT"""
import gzip
import os
import sys
import zipfile

out, rank = sys.argv[1], os.environ["RANK"]


class Flusher:
    # What the finalizer needs is bound now: at exit the module's globals may already be gone.
    def __del__(self, _open=open, _path=os.path.join(out, f"finalized-{rank}")) -> None:
        with _open(_path, "w") as fh:
            fh.write("done")


compressed = gzip.open(os.path.join(out, f"log-{rank}.gz"), "wt")
compressed.write("done")
archive = zipfile.ZipFile(os.path.join(out, f"bundle-{rank}.zip"), "w")
archive.writestr("inside.txt", "done")
keeper = Flusher()
