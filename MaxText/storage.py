"""Where a run's files live: a local path, or a URL (gs://, s3://, ...) through fsspec and the package that serves
its scheme (gcsfs for gs://, the library Orbax's epath uses too). A scheme whose package is missing is one line
naming it, before anything is written. Checkpoints go through Orbax and TensorStore, which write local paths, gs://
and s3://; TensorBoard events through tensorboardX, which writes local paths, gs:// (google-cloud-storage) and s3://
(boto3)."""

import importlib.util
import os
import re

from MaxText.errors import UserError

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# The package fsspec needs for a scheme (what `pip install` takes).
SCHEME_PACKAGES = {
  "gs": "gcsfs",
  "gcs": "gcsfs",
  "s3": "s3fs",
  "s3a": "s3fs",
  "az": "adlfs",
  "abfs": "adlfs",
  "hf": "huggingface_hub",
}
ORBAX_SCHEMES = ("gs", "s3")  # epath and TensorStore both have them
TENSORBOARD_SCHEMES = {"gs": ("google.cloud.storage", "google-cloud-storage"), "s3": ("boto3", "boto3")}


class StorageError(UserError):
  """A path whose scheme can't be served here (its package missing, or no library that writes it)."""


def scheme(path):
  """'gs' for gs://b/x, None for a local path."""
  found = _URL.match(str(path))
  return found.group(1).lower() if found else None


def is_remote(path):
  return scheme(path) is not None


def filesystem(path, what):
  """(fsspec filesystem, path) for a URL; StorageError naming the package its scheme needs when that is missing."""
  import fsspec  # pylint: disable=import-outside-toplevel  (Orbax's etils[epath] brings it)

  kind = scheme(path)
  try:
    return fsspec.core.url_to_fs(str(path))
  except ImportError:
    package = SCHEME_PACKAGES.get(kind, f"the fsspec implementation of {kind}://")
    raise StorageError(
      f"{what}={path}: {kind}:// needs the {package} package, which is not installed: pip install {package} "
      "(nothing was written)"
    ) from None
  except ValueError as e:  # fsspec: "Protocol not known"
    raise StorageError(f"{what}={path}: no filesystem here serves {kind}:// ({e})") from None


def check_checkpoint_path(path, what):
  """Orbax (epath + TensorStore) can read and write `path`: local, gs:// or s3://, with its package installed."""
  kind = scheme(path)
  if kind is None:
    return
  if kind not in ORBAX_SCHEMES:
    raise StorageError(
      f"{what}={path}: checkpoints go through Orbax and TensorStore, which read and write local paths, gs:// and "
      f"s3://, not {kind}://"
    )
  filesystem(path, what)


def check_tensorboard_path(path, what):
  """tensorboardX can write its event files under `path` (a local path, gs:// or s3:// with their packages)."""
  kind = scheme(path)
  if kind is None:
    return
  if kind not in TENSORBOARD_SCHEMES:
    raise StorageError(
      f"{what}={path}: TensorBoard events go through tensorboardX, which writes local paths, gs:// and s3://, not "
      f"{kind}://; set enable_tensorboard=false"
    )
  module, package = TENSORBOARD_SCHEMES[kind]
  if _missing_submodule(module):
    raise StorageError(
      f"{what}={path}: tensorboardX writes {kind}:// event files with {package}, which is not installed: pip install "
      f"{package} (or set enable_tensorboard=false); nothing was written"
    )


def _missing_submodule(module):
  try:
    return importlib.util.find_spec(module) is None
  except ImportError:
    return True


def check_local_shards(pattern, what):
  """ArrayRecord shards and TFDS directories are read from local (or mounted) paths: StorageError for a URL."""
  if is_remote(pattern):
    raise StorageError(
      f"{what}={pattern!r}: ArrayRecord shards are read from a local or mounted path (MaxText's grain pipeline "
      "mounts buckets with gcsfuse too): mount it and give the mounted path, or use dataset_type=hf with "
      "hf_train_files"
    )


def exists(path):
  if not is_remote(path):
    return os.path.exists(path)
  fs, p = filesystem(path, "path")
  return fs.exists(p)


def size_if_file(path):
  """The size in bytes of the file at `path`, None when there is no file there."""
  if not is_remote(path):
    return os.path.getsize(path) if os.path.isfile(path) else None
  fs, p = filesystem(path, "path")
  return fs.size(p) if fs.isfile(p) else None


def makedirs(path):
  if not is_remote(path):
    os.makedirs(path, exist_ok=True)
    return
  fs, p = filesystem(path, "path")
  fs.makedirs(p, exist_ok=True)


def read_text(path):
  if not is_remote(path):
    with open(path, encoding="utf-8") as f:
      return f.read()
  fs, p = filesystem(path, "path")
  return fs.cat_file(p).decode("utf-8")


def write_text(path, text):
  """`text` as the whole file at `path`, or nothing: a local file is written under a temporary name beside it
  (`.<name>.tmp-<pid>`) and renamed into place, the temporary file removed if the write fails."""
  if not is_remote(path):
    directory, name = os.path.split(os.fspath(path))
    tmp = os.path.join(directory, f".{name}.tmp-{os.getpid()}")
    try:
      with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
      os.replace(tmp, path)
    except BaseException:
      try:
        os.remove(tmp)
      except OSError:
        pass  # never created, or already gone: the write's error is the one to say
      raise
    return
  fs, p = filesystem(path, "path")
  fs.pipe_file(p, text.encode("utf-8"))


def _check_makeable(path, what, directory=False):
  """StorageError unless the nearest existing ancestor of absolute local `path` (`path` itself, for a `directory`)
  is a writable directory (missing directories between are made, as mkdir -p)."""
  existing = path if directory else os.path.dirname(path)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise StorageError(f"{what}={path} can't be written: {existing} is a file, not a directory; give another path")
  if not os.access(existing, os.W_OK | os.X_OK):
    raise StorageError(f"{what}={path} can't be written: {existing} is not a writable directory; give another path")


def check_output_file(path, what, example="out.json"):
  """StorageError now, before the work whose result goes to `path` (a file it writes whole at the end), if `path`
  can't be that file: a directory, or under a parent that is a file or not writable. Missing parent directories are
  fine (write_file makes them); a URL's scheme must have its package."""
  if is_remote(path):
    filesystem(path, what)
    return
  path = os.path.abspath(os.fspath(path))
  if os.path.isdir(path):
    raise StorageError(f"{what}={path} is a directory; give a file name, e.g. {what}={os.path.join(path, example)}")
  _check_makeable(path, what)
  if len(os.path.basename(path).encode()) > 255 - len(f".tmp-{os.getpid()}") - 1:
    raise StorageError(f"{what}={path}: the file name is too long (at most 255 bytes with its temporary suffix)")


def check_output_dir(path, what):
  """StorageError now, before the work whose results go into directory `path`, if it can't be that directory: a
  file, or under a parent that is a file or not writable (missing parents are made, as mkdir -p)."""
  if is_remote(path):
    filesystem(path, what)
    return
  path = os.path.abspath(os.fspath(path))
  if os.path.exists(path) and not os.path.isdir(path):
    raise StorageError(f"{what} {path} is a file, not a directory; give a directory (it is made if missing)")
  _check_makeable(path, what, directory=True)


def write_file(path, text):
  """write_text, making `path`'s missing parent directories first (check_output_file said they can be made)."""
  if not is_remote(path):
    os.makedirs(os.path.dirname(os.path.abspath(os.fspath(path))), exist_ok=True)
  write_text(path, text)


def remove(path):
  if not is_remote(path):
    os.remove(path)
    return
  fs, p = filesystem(path, "path")
  fs.rm_file(p)


class AppendFile:
  """A text file appended to: a local file opened for appending, or on object storage (which has no append) the
  content kept in memory and written whole at each flush, as tensorboardX's gs:// writer does."""

  def __init__(self, path):
    self.path = path
    if is_remote(path):
      self._remote, self._text, self._file = True, read_text(path) if exists(path) else "", None
    else:
      self._remote, self._file = False, open(path, "a", encoding="utf-8")  # pylint: disable=consider-using-with

  def write(self, text):
    if self._remote:
      self._text += text
    else:
      self._file.write(text)

  def flush(self):
    if self._remote:
      write_text(self.path, self._text)
    else:
      self._file.flush()

  def close(self):
    if self._remote:
      self.flush()
    else:
      self._file.close()
