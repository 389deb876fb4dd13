"""Files of a model folder: a local folder, or a Hugging Face Hub repository (``owner/name[@revision]``) fetched
into the Hugging Face cache. Every Hub failure is one :class:`~detr_peg.errors.CheckpointError` sentence.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    HTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from detr_peg.errors import CheckpointError

#: ``owner/name`` or ``name``, as the Hub spells repository ids, with an optional ``@revision``.
HUB_NAME = re.compile(r"(?P<repo>(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?")


@dataclass(frozen=True)
class ModelFolder:
    """Where a model folder's files come from: ``local``, or ``repo_id`` at ``revision`` (None: default branch)."""

    spec: str
    local: Path | None
    repo_id: str | None = None
    revision: str | None = None

    def file(self, name: str, **download: Any) -> Path | None:
        """The local path of the folder's file ``name`` (None when absent); ``download`` goes to ``hf_hub_download``.

        Raises CheckpointError: Hub unreachable and not cached, or no such repository or revision.
        """
        if self.local is not None:
            path = self.local / name
            return path if path.is_file() else None
        with hub_errors(self.spec):
            try:
                return Path(hf_hub_download(self.repo_id, name, revision=self.revision, **download))
            except LocalEntryNotFoundError:
                raise
            except EntryNotFoundError:
                return None

    def first_file(self, names: Sequence[str], what: str, **download: Any) -> Path:
        """The first of ``names`` that the folder holds; raises CheckpointError when none is."""
        for name in names:
            path = self.file(name, **download)
            if path is not None:
                return path
        run = self.local is not None and (self.local / "checkpoint.pth").is_file()  # a training run's folder
        hint = f"; read its checkpoint with Detector.from_checkpoint('{self.local / 'checkpoint.pth'}')" if run else ""
        listed = "" if list(names) == [what] else f" ({' or '.join(names)})"
        raise CheckpointError(f"{self.spec} holds no {what}{listed}{hint}.")


#: Endings of checkpoint and config files: a missing ``runs/model.pth`` is a missing file, not a Hub name.
FILE_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors", ".ckpt", ".onnx", ".json", ".yaml", ".yml")


def is_hub_name(spec: str) -> bool:
    """Whether ``spec`` names a Hub repository: ``owner/name[@revision]``, and no local file or folder of that name."""
    repo = spec.split("@")[0]
    return (
        not os.path.lexists(spec)
        and HUB_NAME.fullmatch(spec) is not None
        and "/" in repo
        and not repo.lower().endswith(FILE_SUFFIXES)
    )


def model_folder(spec: str | os.PathLike) -> ModelFolder:
    """The :class:`ModelFolder` that ``spec`` names; raises CheckpointError when neither a folder nor a Hub name."""
    text = os.fsdecode(spec)
    if os.path.isdir(text):
        return ModelFolder(text, Path(text))
    if os.path.isfile(text):
        reader = "from_onnx" if text.lower().endswith(".onnx") else "from_checkpoint"
        raise CheckpointError(f"{text} is a file, not a model folder: read it with Detector.{reader}.")
    match = HUB_NAME.fullmatch(text)
    if match is None or not is_hub_name(text):
        raise CheckpointError(
            f"{text} is neither a local model folder nor a Hugging Face Hub name (owner/name); "
            "check the path or the name."
        )
    return ModelFolder(text, None, match["repo"], match["revision"])


@contextlib.contextmanager
def hub_errors(spec: str) -> Iterator[None]:
    """Turn the ``huggingface_hub`` errors raised inside into one-sentence :class:`CheckpointError` messages."""
    try:
        yield
    except LocalEntryNotFoundError as exc:
        cause = exc.__cause__ or exc.__context__  # what the Hub (or the network) answered, when asked
        why = _first_line(cause) if cause is not None else "no network, or HF_HUB_OFFLINE is set"
        raise CheckpointError(
            f"{spec} is not in the local Hugging Face cache and could not be fetched from the Hub ({why}), nor is it "
            "a local folder; check the path, or download the folder where there is network and pass its local path."
        ) from None
    except RepositoryNotFoundError:
        raise CheckpointError(
            f"{spec} is not a model repository of the Hugging Face Hub (or it is private or gated: log in "
            "with `hf auth login`), nor a local folder; check the name or the path."
        ) from None
    except RevisionNotFoundError:
        raise CheckpointError(f"{spec}: the repository has no such revision; check the part after '@'.") from None
    except (HTTPError, OSError) as exc:  # network errors come in many types (httpx's are HTTPError)
        raise CheckpointError(
            f"Could not fetch {spec} from the Hugging Face Hub ({_first_line(exc)}), and it is not a local folder; check "
            "the path, or pass a local folder."
        ) from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(".")
