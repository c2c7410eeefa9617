"""The submitter token: the secret that makes a client the creator of its batches.

A batch record keeps only a digest of it (sandfleet/core/batch_creator.py), and a job may join a batch
only with the token that created it. It is ``SANDFLEET_SUBMITTER_TOKEN`` when set (a team that adds
jobs to one batch from several machines shares it), else made once, at random, in
``{client_state_dir}/submitter.token`` (mode 0600) and read from there by every later process of the
user, so ``sandfleet batch FILE --batch-id B`` and a later ``sandfleet submit --batch-id B`` agree.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from sandfleet.core.errors import ClientStateError
from sandfleet.core.settings import Settings
from sandfleet.producer.ledger import make_state_folder, state_folder, unusable

TOKEN_NAME = "submitter.token"
TOKEN_BYTES = 32  # 256 bits, as urlsafe base64 (43 characters)
MIN_TOKEN_CHARS = 16


def submitter_token(settings: Settings) -> str:
    """The user's submitter token: the setting, else the token file (made on first use)."""
    if settings.submitter_token:
        return settings.submitter_token
    path = state_folder(settings) / TOKEN_NAME
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    make_state_folder(path.parent)
    _create(path)
    return _read(path)


def _read(path: Path) -> str:
    try:
        token = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as e:
        raise ClientStateError(unusable(path, e)) from None
    if len(token) < MIN_TOKEN_CHARS:
        raise ClientStateError(
            f"the submitter token in {path} is shorter than {MIN_TOKEN_CHARS} characters: delete the file "
            "to make a new one (you then can no longer add jobs to the batches the old one created)"
        )
    return token


def _create(path: Path) -> None:
    """Write a new token, unless another process of the user got there first (link, not overwrite)."""
    draft = path.with_name(f".{TOKEN_NAME}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        fd = os.open(draft, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(secrets.token_urlsafe(TOKEN_BYTES) + "\n")
        try:
            os.link(draft, path)
        except FileExistsError:
            pass  # another process made it first: both use that one
    except OSError as e:
        raise ClientStateError(unusable(path, e)) from None
    finally:
        draft.unlink(missing_ok=True)
