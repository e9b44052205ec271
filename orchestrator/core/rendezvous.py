"""Rendezvous, in one place: the port, the init URL, and the file:// rendezvous files and their removal.

Standard library only: ranks, the local supervisor, the SLURM agent and ``plan`` all use it.
"""

from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path

#: Auto ports live in [PORT_BASE, PORT_BASE + PORT_SPAN): below Linux's ephemeral range (32768+)
#: and above the usual service ports.
PORT_BASE = 20000
PORT_SPAN = 12000


#: Multipliers of a numeric job id and of the restart count in ``derive_port``: 7 is prime to
#: PORT_SPAN, so job ids less than PORT_SPAN apart get distinct ports at one restart count, and
#: RESTART_STRIDE (searched for it) keeps ports distinct between jobs less than 1,333 ids apart
#: whose restart counts differ by up to 8, and between a job's first 9 attempts.
ID_STRIDE, RESTART_STRIDE = 7, 9331


def derive_port(job_id: str, restart: int = 0) -> int:
    """The same port on every rank, from the job id and restart count, with no communication.

    A numeric job id (SLURM_JOB_ID) is mapped arithmetically, so jobs submitted close together
    (an array's tasks, one user's jobs sharing a node) never draw the same port, as a hash would
    now and then; other ids (a local run's) are hashed. A restart gets a different port, so a
    port left in TIME_WAIT by the previous attempt is never reused by the next one.
    """
    if job_id.isascii() and job_id.isdigit():
        return PORT_BASE + (ID_STRIDE * int(job_id) + RESTART_STRIDE * restart) % PORT_SPAN
    return PORT_BASE + zlib.crc32(f"{job_id}:{restart}".encode()) % PORT_SPAN


def port_is_free(port: int, host: str = "") -> bool:
    """Whether a listening socket could bind ``port`` on every address (as torch's TCPStore does):
    a port held on any one address of this host is not free."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(preferred: int) -> int | None:
    """The preferred port if free, else the next free one in the auto range; None if none is."""
    for i in range(PORT_SPAN):
        port = PORT_BASE + (preferred - PORT_BASE + i) % PORT_SPAN if preferred >= PORT_BASE else preferred + i
        if port_is_free(port):
            return port
    return None


def init_url(method: str, master_addr: str, master_port: int | str, rendezvous_file: str | None) -> str:
    """The URL ``init_process_group`` gets for the spec's ``distributed.init_method``."""
    if method == "tcp":
        return f"tcp://{master_addr}:{master_port}"
    if method == "file":
        if not rendezvous_file:
            raise ValueError("file:// init needs a rendezvous file path")
        return f"file://{rendezvous_file}"
    return "env://"


def rendezvous_file(rendezvous_dir: str, job_id: str, attempt: int | str) -> str:
    """A unique file per job and attempt: a stale file from an earlier attempt is never reused."""
    return os.path.join(rendezvous_dir, f"rendezvous-{job_id}-{attempt}")


def rendezvous_path(init_method: str) -> str | None:
    """The file behind a file:// init URL, or None for env:// and tcp://."""
    return init_method[len("file://"):] or None if init_method.startswith("file://") else None


def remove_rendezvous_file(init_method: str) -> None:
    """Every rank removes the job's file:// rendezvous file once its entrypoint is over.

    By then every rank has passed the rendezvous (a rank that never joins makes its peers fail
    anyway), and each rank's own store is torn down inside the entrypoint, so the last rank out
    leaves nothing behind even for a script that never tears its process group down.
    """
    path = rendezvous_path(init_method)
    if path:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            print(f"[launcher] could not remove the rendezvous file {path}: {exc}", file=sys.stderr)


def remove_earlier_files(rendezvous_dir: str, job_id: str, attempt: int | None = None) -> list[str]:
    """The files earlier attempts of this job left (a killed rank cannot remove its own), never
    another job's; every attempt's when ``attempt`` is None."""
    prefix = os.path.basename(rendezvous_file(rendezvous_dir, job_id, ""))
    folder = Path(rendezvous_dir)
    removed = []
    for path in folder.glob(f"{prefix}*") if folder.is_dir() else []:
        number = path.name[len(prefix):]
        if number.isascii() and number.isdigit() and (attempt is None or int(number) < attempt):
            try:
                path.unlink()
                removed.append(str(path))
            except FileNotFoundError:
                pass
    return removed
