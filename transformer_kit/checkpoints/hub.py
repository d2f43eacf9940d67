"""Checkpoints by their Hugging Face Hub name: ``org/name`` (a checkpoint repository) and
``org/name:FILE.gguf`` (one file of a GGUF repository) resolved to local paths through
``huggingface_hub``, which downloads only the files the kit reads into its cache.

A local path of the same name always wins: ``Qwen/Qwen3-0.6B`` is a Hub name only where no such
folder exists relative to the working directory. ``huggingface_hub`` honours its cache
(``HF_HOME``, ``HF_HUB_CACHE``), ``HF_TOKEN`` for gated and private repositories,
``HF_HUB_OFFLINE=1`` (the cache only, no network) and ``HF_ENDPOINT`` (a mirror); the cache, the
offline switch and the endpoint are read at each call, so a variable set after
``huggingface_hub`` was imported still counts. Its own progress bars show each download. Every
failure is a :class:`~transformer_kit.core.errors.CheckpointError` that says what was given, what is
allowed and what to do.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from transformer_kit.chat.templates import TEMPLATE_FOLDER
from transformer_kit.core.errors import CheckpointError, missing_path
from transformer_kit.tokenizer import TOKENIZER_FILES

#: A repository id as the Hub spells it: ``name`` or ``org/name``; letters, digits, '-', '_', '.'.
_REPO_ID = re.compile(r"(?:[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?/)?[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?",
                      re.ASCII)
#: Names ending so are files the kit reads (a config, weights, an export's arrays), never Hub ids.
_FILE_SUFFIXES = (".yaml", ".yml", ".json", ".gguf", ".safetensors", ".bin", ".onnx", ".npy", ".txt")
#: What a checkpoint repository's folder (its root, or a sentence-transformers body) is read for
#: besides its weights: the config and the tokenizer with its chat templates.
CONFIG_FILES = ("config.json", "generation_config.json", *TOKENIZER_FILES, f"{TEMPLATE_FOLDER}/*.jinja")
#: The weights (a sharded checkpoint's shards follow from its index).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
#: A sentence-transformers repository's own files (the modules' folders follow from modules.json).
SENTENCE_FILES = ("modules.json", "config_sentence_transformers.json", "sentence_bert_config.json")
#: The weights read where a folder has no safetensors (the pre-safetensors layout).
PYTORCH_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
HUB_EXAMPLE = "org/name, e.g. 'Qwen/Qwen3-0.6B'"
ALLOWED = f"a local folder or file, a Hugging Face Hub repository id ({HUB_EXAMPLE}), or org/name:FILE.gguf"


def is_repo_id(name: str) -> bool:
    """Whether ``name`` is spelled as a Hub repository id (``org/name`` or ``name``), not as a
    path (``./x``, ``a/b/c``) or a file the kit reads (``config.yaml``, ``model.gguf``)."""
    return (bool(_REPO_ID.fullmatch(name)) and "--" not in name and ".." not in name
            and not name.endswith(".git") and not name.lower().endswith(_FILE_SUFFIXES))


def split_gguf_name(name: str) -> tuple[str, str] | None:
    """``org/name:FILE.gguf`` -> (``org/name``, ``FILE.gguf``); None for another name."""
    repo, colon, file = name.partition(":")
    if colon and is_repo_id(repo) and file.lower().endswith(".gguf") and ".." not in file.split("/"):
        return repo, file
    return None


def is_hub_name(source: str | Path) -> bool:
    """Whether ``source`` is taken as a Hub name: no local path of that name exists and it is a
    repository id or ``org/name:FILE.gguf``."""
    text = str(source)
    return not Path(text).exists() and (is_repo_id(text) or split_gguf_name(text) is not None)


def _not_local(source: str | Path, what: str) -> CheckpointError:
    return CheckpointError(f"{missing_path(source, what)} It is no local path, and not spelled as a "
                           "Hub name (org/name: letters, digits, '-', '_', '.').")


def _local_with_revision(source: str | Path, revision: str) -> CheckpointError:
    return CheckpointError(f"revision={revision!r} picks a version of a Hub repository, but "
                           f"{str(source)!r} is a local path (a local path of a Hub name's spelling "
                           "wins). Leave out the revision, or move the local folder away.")


def local_source(source: str | Path, *, revision: str | None = None, weights: bool = True) -> Path:
    """Any source as a local path, for callers that take every kind (the command line): a Hub
    name's checkpoint folder (:func:`checkpoint_folder`) or GGUF file (``org/name:FILE.gguf``,
    :func:`gguf_path`), else ``source`` itself (a local path wins, a missing one is left for the
    caller to name); ``revision`` is refused for a local path. ``weights=False``: a checkpoint's
    config and tokenizer only (for its config)."""
    text = str(source)
    if is_hub_name(text):
        if split_gguf_name(text) is not None:
            return gguf_path(text, revision=revision)
        return checkpoint_folder(text, revision=revision, weights=weights)
    if revision is None:
        return Path(text)
    if Path(text).exists():
        raise _local_with_revision(source, revision)
    raise _not_local(source, ALLOWED)


def checkpoint_folder(source: str | Path, *, revision: str | None = None, weights: bool = True) -> Path:
    """The local folder of checkpoint ``source``: a local path as it is, else the cached snapshot
    of Hub repository ``source`` at ``revision`` (a branch, tag or commit; the default branch
    when None), its missing files downloaded first: config.json, generation_config.json, the
    tokenizer files and chat templates, the safetensors weights (every shard of an index), a
    sentence-transformers repository's modules.json, settings and modules' folders, and
    pytorch_model.bin only where a folder has no safetensors. ``weights=False`` leaves out the
    weights of the checkpoint itself (enough for its config)."""
    text = str(source)
    if Path(text).exists():
        if revision is not None:
            raise _local_with_revision(source, revision)
        return Path(text)
    if not is_repo_id(text):
        raise _not_local(source, f"a Hugging Face checkpoint folder or a Hub repository id ({HUB_EXAMPLE})")
    folder = _snapshot(text, revision, (*CONFIG_FILES, *(WEIGHT_FILES if weights else ()), *SENTENCE_FILES))
    at = folder.name  # the commit: every later download reads the same version
    if not (folder / "config.json").is_file() and not (folder / "modules.json").is_file():
        raise CheckpointError(
            f"Hub repository {text!r} (revision {revision or 'main'}, commit {at}) has neither "
            "config.json nor modules.json, so it is not a transformers or sentence-transformers "
            "checkpoint. A GGUF repository: name its file, org/name:FILE.gguf (gguf_file=...).")
    body = _sentence_modules(text, at, folder, weights) if (folder / "modules.json").is_file() else folder
    if weights:
        _complete_weights(text, at, folder, body.relative_to(folder))
    return folder


def _sentence_modules(repo: str, at: str, folder: Path, weights: bool) -> Path:
    """Download a sentence-transformers repository's module folders (the Transformer body's
    checkpoint files, its weights with ``weights``, each other module's config.json and
    weights); returns the body."""
    try:
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
        paths = [str(entry.get("path", "")).strip("/") for entry in modules]
        dense = [path for entry, path in zip(modules, paths, strict=True)
                 if path and str(entry.get("type", "")).endswith("Dense")]
    except (OSError, ValueError, AttributeError, TypeError):
        return folder  # the loader names what is wrong with modules.json
    if not paths:
        return folder
    body_files = (*CONFIG_FILES, *(WEIGHT_FILES if weights else ()))
    patterns = [f"{paths[0]}/{name}" for name in body_files] if paths[0] else []
    patterns += [f"{path}/config.json" for path in filter(None, paths[1:])]
    patterns += [f"{path}/model.safetensors" for path in dense]  # the only modules with weights
    if patterns:
        _snapshot(repo, at, patterns)
    for path in dense:
        _complete_weights(repo, at, folder, Path(path))
    return folder / paths[0]


def _complete_weights(repo: str, at: str, folder: Path, sub: Path) -> None:
    """Download the shards a safetensors index names, or the PyTorch weights of a folder
    without safetensors (folder ``sub`` of the snapshot ``folder``)."""
    here = folder / sub
    prefix = "" if str(sub) == "." else f"{sub.as_posix()}/"
    if (here / "model.safetensors").is_file():
        return
    index = here / "model.safetensors.index.json"
    if not index.is_file():
        _snapshot(repo, at, [prefix + name for name in PYTORCH_FILES])
        index = here / "pytorch_model.bin.index.json"
        if (here / "pytorch_model.bin").is_file() or not index.is_file():
            return  # the loader names a folder without weights
    try:
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return  # the loader names a broken index
    _snapshot(repo, at, [prefix + str(shard) for shard in shards])


def gguf_path(source: str | Path, *, gguf_file: str | None = None, revision: str | None = None) -> Path:
    """The local path of GGUF ``source``: a local file as it is, file ``gguf_file`` of a local
    folder, or the cached file of a Hub repository, named ``org/name:FILE.gguf`` or ``org/name``
    with ``gguf_file``, at ``revision`` (only that file is downloaded)."""
    text = str(source)
    if Path(text).exists():
        if revision is not None:
            raise _local_with_revision(source, revision)
        if gguf_file is not None and not Path(text).is_dir():
            raise CheckpointError(f"{text!r} is a file; gguf_file={gguf_file!r} names a file in a "
                                  "folder or a Hub repository. Leave out gguf_file.")
        return Path(text) / gguf_file if gguf_file is not None else Path(text)
    named = split_gguf_name(text)
    if named is not None and gguf_file is not None and gguf_file != named[1]:
        raise CheckpointError(f"{text!r} names its file, and gguf_file={gguf_file!r} names another; "
                              "give one of them.")
    if named is None and is_repo_id(text):
        if gguf_file is None:
            raise CheckpointError(f"{text!r} is taken as a Hub repository; name its GGUF file: "
                                  f"'{text}:FILE.gguf' (gguf_file='FILE.gguf' in Python).")
        named = (text, gguf_file)
    if named is None:
        raise _not_local(source, "a GGUF file or a Hub name (org/name:FILE.gguf)")
    return _file(*named, revision)


def _offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as set now, else as huggingface_hub read it."""
    from huggingface_hub import constants

    now = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    if now is None:
        return bool(constants.HF_HUB_OFFLINE)
    return now.strip().upper() in ("1", "ON", "YES", "TRUE")


def cache_dir() -> Path:
    """The Hub cache as the environment names it now: HF_HUB_CACHE, else HF_HOME/hub, else
    huggingface_hub's default (~/.cache/huggingface/hub)."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE)


def _snapshot(repo: str, revision: str | None, patterns: list[str] | tuple[str, ...]) -> Path:
    """The snapshot folder of ``repo`` at ``revision``, the files matching ``patterns`` that
    exist there downloaded into it."""
    from huggingface_hub import snapshot_download

    with _hub_errors(repo, revision):
        return Path(snapshot_download(repo, revision=revision, allow_patterns=list(patterns),
                                      cache_dir=cache_dir(), local_files_only=_offline(),
                                      endpoint=os.environ.get("HF_ENDPOINT") or None))


def _file(repo: str, name: str, revision: str | None) -> Path:
    """The cached file ``name`` of ``repo`` at ``revision``, downloaded first if missing."""
    from huggingface_hub import hf_hub_download

    with _hub_errors(repo, revision, name):
        return Path(hf_hub_download(repo, name, revision=revision, cache_dir=cache_dir(),
                                    local_files_only=_offline(),
                                    endpoint=os.environ.get("HF_ENDPOINT") or None))


@contextmanager
def _hub_errors(repo: str, revision: str | None, file: str | None = None) -> Iterator[None]:
    """huggingface_hub's exceptions as CheckpointErrors that say what to do."""
    from huggingface_hub import errors

    try:
        yield
    except errors.OfflineModeIsEnabled:
        raise CheckpointError(_not_cached(repo, revision, file, offline=True)) from None
    except errors.GatedRepoError:
        raise CheckpointError(
            f"Hub repository {repo!r} is gated: accept its conditions on https://huggingface.co/{repo} "
            "and give a token of that account (HF_TOKEN, or `hf auth login`).") from None
    except errors.RepositoryNotFoundError:
        raise CheckpointError(
            f"{repo!r} is not a local path, and the Hub has no repository {repo!r} that this machine "
            "may read: it does not exist, or it is private. Check the name (org/name), or give a "
            "token with access to it (HF_TOKEN, or `hf auth login`).") from None
    except errors.RevisionNotFoundError:
        raise CheckpointError(f"Hub repository {repo!r} has no revision {revision!r}; give one of its "
                              "branches, tags or commits (revision=..., --revision).") from None
    except errors.LocalEntryNotFoundError:
        raise CheckpointError(_not_cached(repo, revision, file, offline=_offline())) from None
    except errors.EntryNotFoundError:
        raise CheckpointError(f"Hub repository {repo!r} (revision {revision or 'main'}) has no file "
                              f"{file!r}; give the name of one of its files (see "
                              f"https://huggingface.co/{repo}/tree/{revision or 'main'}).") from None
    except errors.HFValidationError as exc:
        raise CheckpointError(f"{repo!r} with revision {revision!r} is not a valid Hub name: {exc} "
                              f"Give {ALLOWED}.") from None
    except errors.HfHubHTTPError as exc:
        raise CheckpointError(f"The Hub refused {repo!r}: {str(exc).splitlines()[0]} Try again later, "
                              "or download it and give the folder.") from None
    except OSError as exc:  # the cache: not writable, or full
        raise CheckpointError(f"Hub repository {repo!r} cannot be placed in the Hub cache "
                              f"{str(cache_dir())!r}: {exc}. Free space there, or point HF_HUB_CACHE "
                              "(HF_HOME) at a writable folder.") from None


def _not_cached(repo: str, revision: str | None, file: str | None, *, offline: bool) -> str:
    """The sentence for a repository (or one of its files) that is not in the cache."""
    what = f"file {file!r} of Hub repository {repo!r}" if file else f"Hub repository {repo!r}"
    where = (f"{what} (revision {revision or 'main'}) is not a local path and not in the Hub cache "
             f"{str(cache_dir())!r}")
    if offline:
        return (f"{where}, and HF_HUB_OFFLINE is set, so nothing is downloaded. Unset HF_HUB_OFFLINE "
                "to download it, or point HF_HUB_CACHE (HF_HOME) at a cache that holds it.")
    return (f"{where}, and the Hub cannot be reached. Check the network (or the name), or point "
            "HF_HUB_CACHE (HF_HOME) at a cache that holds it.")
