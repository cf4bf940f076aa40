"""Finding an ImageDatastore's image files: in local folders (wildcards and symbolic links followed, as in
MATLAB's imageDatastore; hidden files left out) or through fsspec for `s3://...` and other URLs, and a message
that says why none was found.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nbscale.data.reading import is_url
from nbscale.errors import DatastoreError


def image_files(locations: Sequence[Any], extensions: tuple[str, ...], include_subfolders: bool) -> list[str]:
    """The files under `locations` (folders, files, wildcard patterns or URLs) whose names end in one of
    `extensions` (lower case, with their dots), sorted within each location.

    Raises DatastoreError when a location does not exist, a pattern matches nothing, or no image is found
    (saying which fix applies).
    """
    files: list[str] = []
    for place in locations:
        place = os.fspath(place)
        listed = (
            _list_url(place, include_subfolders)
            if is_url(place)
            else [file for match in _matches(place) for file in _list_local(match, include_subfolders)]
        )
        files += sorted(f for f in listed if f.lower().endswith(extensions))
    if not files:
        raise DatastoreError(_no_images(locations, extensions, include_subfolders))
    return files


def _list_local(location: Path, include_subfolders: bool) -> list[str]:
    if location.is_file():
        return [str(location)]
    if location.exists() and not location.is_dir():
        raise DatastoreError(
            f"ImageDatastore: {str(location)!r} is not a folder or an image file (a device, a "
            "pipe or a socket): give the folder that holds the images, or the image files."
        )
    if not location.is_dir():
        raise DatastoreError(
            f"ImageDatastore: the folder {str(location)!r} does not exist. Check the path "
            f"(it is read relative to {os.getcwd()!r})."
        )
    if not include_subfolders:
        return [str(p) for p in location.iterdir() if p.is_file() and not _hidden(p.relative_to(location))]
    return _walk(location)


def _matches(place: str) -> list[Path]:
    """The local paths `place` names: itself, or, as in MATLAB, what its wildcards match ("images/*/", "*.png").

    Absolute, as MATLAB's Files are: the files must still name the same images after the notebook changes folder,
    and on a pool, whose workers read them from the folder the pool started in."""
    path = Path(os.path.abspath(Path(place).expanduser()))
    if path.exists() or not any(c in place for c in "*?["):
        return [path]
    matches = sorted(glob.glob(str(path)))
    if not matches:
        raise DatastoreError(
            f"ImageDatastore: nothing matches {place!r} (read relative to {os.getcwd()!r}). Check "
            "the pattern, or give the folder itself."
        )
    return [Path(match) for match in matches]


def _walk(location: Path) -> list[str]:
    """Every file under `location`, following symbolic links to folders (as MATLAB's imageDatastore does).

    A file keeps the path through the link, so a linked class folder is labelled by the link's name. A link to
    a folder that holds it (a loop) is not entered again, so link loops end.
    """
    files: list[str] = []
    above: dict[str, frozenset[tuple[int, int]]] = {}  # each folder's ancestors, as (device, inode)
    for folder, subfolders, names in os.walk(location, followlinks=True):
        status = os.stat(folder)
        identity, ancestors = (status.st_dev, status.st_ino), above.pop(folder, frozenset())
        if identity in ancestors:
            subfolders[:] = []
            continue
        # hidden files and folders (.ipynb_checkpoints, macOS's ._name.png twins) are not part of the data
        subfolders[:] = sorted(name for name in subfolders if not _hidden(Path(name)))
        above.update({os.path.join(folder, name): ancestors | {identity} for name in subfolders})
        files += [
            os.path.join(folder, name)
            for name in names
            if not _hidden(Path(name)) and os.path.isfile(os.path.join(folder, name))
        ]
    return files


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") or part == "__MACOSX" for part in relative.parts)


def _list_url(location: str, include_subfolders: bool) -> list[str]:
    try:
        import fsspec
    except ImportError as error:
        raise DatastoreError(
            f"ImageDatastore: reading {location!r} needs fsspec (and the filesystem's package, "
            "e.g. s3fs for s3://): pip install 'nbscale[s3]'"
        ) from error
    try:
        filesystem, root = fsspec.core.url_to_fs(location, **_bounded_connect(location))
        if not root.strip("/"):
            raise DatastoreError(
                f"ImageDatastore: {location!r} names no bucket or folder: give one, e.g. 's3://my-bucket/images'."
            )
        if filesystem.isfile(root):
            return [location]
        if not filesystem.isdir(root):
            raise DatastoreError(f"ImageDatastore: the folder {location!r} does not exist or cannot be listed.")
        # the listing says which entries are files: asking the store about each one would cost a request per object
        entries = (
            filesystem.find(root, detail=True).values() if include_subfolders else filesystem.ls(root, detail=True)
        )
    except DatastoreError:
        raise
    except Exception as error:  # botocore, aiohttp, fsspec: each its own errors
        raise DatastoreError(
            f"ImageDatastore: cannot list {location!r} ({type(error).__name__}: {error}). Check the "
            "address, that its server is running and reachable from here, and the credentials "
            "(for s3://: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)."
        ) from error
    return [filesystem.unstrip_protocol(entry["name"]) for entry in entries if entry.get("type") != "directory"]


CONNECT_TIMEOUT_S = 10  # an unreachable store is told within seconds, not after minutes of retries


def _bounded_connect(location: str) -> dict[str, Any]:
    """fsspec options that bound the time to connect (and the retries) for S3 and HTTP. A fresh filesystem each
    time: a cached one keeps the endpoint and credentials the environment had when it was made."""
    protocol = location.split("://", 1)[0].lower()
    if protocol in ("s3", "s3a"):
        return {
            "skip_instance_cache": True,
            "config_kwargs": {"connect_timeout": CONNECT_TIMEOUT_S, "retries": {"max_attempts": 2}},
        }
    if protocol in ("http", "https"):
        import aiohttp

        return {
            "skip_instance_cache": True,
            "client_kwargs": {"timeout": aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT_S)},
        }
    return {}


def _no_images(locations: Sequence[Any], extensions: tuple[str, ...], include_subfolders: bool) -> str:
    """Why no image was found, and the fix that applies: other extensions, subfolders, or broken links."""
    places = [os.fspath(p) for p in locations]
    message = f"ImageDatastore: no image files with extensions {list(extensions)} in {places}"
    local = [Path(p).expanduser() for p in places if not is_url(p) and Path(p).expanduser().is_dir()]
    entries = [entry for folder in local for entry in (folder.rglob("*") if include_subfolders else folder.iterdir())]
    broken = [entry for entry in entries if entry.is_symlink() and not entry.exists()]
    others = sorted({entry.suffix.lower() or entry.name for entry in entries if entry.is_file()})
    if broken:
        return (
            f"{message}. {len(broken)} symbolic link(s) there point nowhere (e.g. {str(broken[0])!r} -> "
            f"{os.readlink(broken[0])!r}): fix or remove them."
        )
    if not include_subfolders and any(entry.is_dir() for entry in entries):
        return (
            f"{message}, and include_subfolders=False: the images may be in its subfolders (include_subfolders=True)."
        )
    if others:
        return f"{message}; its files are {others[:8]}: pass file_extensions= to read those."
    return f"{message}: the folder has no files (include_subfolders={include_subfolders}). Check the path."


def folder_name(file: str) -> str:
    """The name of the folder holding `file` (a path or a URL): its label under label_source="foldernames"."""
    return file.rstrip("/").split("/")[-2] if is_url(file) else Path(file).parent.name
