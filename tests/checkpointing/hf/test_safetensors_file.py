"""The safetensors reader against files the reference (Rust) implementation wrote, the writer against the format's
definition parsed here by hand, and the one-line errors for damaged files."""

import json
import struct

import ml_dtypes
import numpy as np
import pytest

from MaxText.checkpointing.hf import HFError
from MaxText.checkpointing.hf import safetensors_file as st
from tests.conftest import REPO

TINY = REPO / "tests" / "data" / "hf_tiny"


def _parse(path):
  """The format by its definition: u64 little-endian header length, JSON header, data."""
  raw = path.read_bytes()
  (n,) = struct.unpack("<Q", raw[:8])
  header = json.loads(raw[8 : 8 + n])
  return header, raw[8 + n :], n


def test_reads_the_reference_writers_files_and_their_slices(monkeypatch):
  index = json.loads((TINY / "model.safetensors.index.json").read_text())["weight_map"]
  name = "model.layers.1.mlp.down_proj.weight"
  with st.SafetensorsFile(TINY / index[name]) as f:
    header, data, _ = _parse(TINY / index[name])
    begin, end = header[name]["data_offsets"]
    expected = np.frombuffer(data[begin:end], ml_dtypes.bfloat16).reshape(header[name]["shape"])
    assert f.info(name).shape == (64, 160) and f.info(name).dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(f.read(name).view(np.uint16), expected.view(np.uint16))
    monkeypatch.setattr(st, "READ_CHUNK_BYTES", 3 * 160 * 2)  # 3 rows per chunk: the chunked path
    for index_ in [(slice(5, 20),), (slice(5, 20), slice(16, 48)), (slice(None), slice(150, 160)), (slice(63, 64),)]:
      np.testing.assert_array_equal(f.read(name, index_).view(np.uint16), expected[index_].view(np.uint16))


def test_writer_lays_out_the_format(tmp_path):
  arrays = {
    "w": np.arange(12, dtype=np.float32).reshape(3, 4).astype(ml_dtypes.bfloat16),
    "codes": np.arange(10, dtype=np.uint8).reshape(2, 5),
    "scale": np.float32(0.25).reshape(()),
    "e4m3": np.array([0.5, -448.0, 3.0], ml_dtypes.float8_e4m3fn),
  }
  writer = st.SafetensorsWriter(
    tmp_path / "x.safetensors", {k: (a.dtype, a.shape) for k, a in arrays.items()}, metadata={"format": "pt"}
  )
  writer.write("w", arrays["w"][1:], row=1)  # rows in any order
  writer.write("w", arrays["w"][:1])
  for k in ("codes", "scale", "e4m3"):
    writer.write(k, arrays[k])
  writer.close()
  header, data, n = _parse(tmp_path / "x.safetensors")
  assert n % 8 == 0 and header["__metadata__"] == {"format": "pt"}
  assert {k: header[k]["dtype"] for k in arrays} == {"w": "BF16", "codes": "U8", "scale": "F32", "e4m3": "F8_E4M3"}
  for k, a in arrays.items():
    begin, end = header[k]["data_offsets"]
    assert header[k]["shape"] == list(a.shape) and data[begin:end] == np.ascontiguousarray(a).tobytes()
  with st.SafetensorsFile(tmp_path / "x.safetensors") as f:
    assert f.read("scale").shape == () and f.read("scale") == 0.25


def test_writer_refuses_to_close_an_incomplete_file(tmp_path):
  writer = st.SafetensorsWriter(tmp_path / "x.safetensors", {"w": (np.float32, (4, 2))})
  writer.write("w", np.zeros((2, 2), np.float32))
  with pytest.raises(ValueError, match="not written in full"):
    writer.close()


@pytest.mark.parametrize(
  "damage, message",
  [
    (lambda raw: raw[:-10], "truncated"),
    (lambda raw: raw[:5], "truncated"),
    (lambda raw: raw.replace(b'"F32"', b'"F99"'), "dtype 'F99'"),
    (lambda raw: raw[:8] + b"{not json" + raw[17:], "not JSON"),
    (lambda raw: struct.pack("<Q", 10**12) + raw[8:], "header claims"),
  ],
)
def test_damaged_files_are_one_line_errors(tmp_path, damage, message):
  writer = st.SafetensorsWriter(tmp_path / "ok.safetensors", {"w": (np.float32, (4, 4))})
  writer.write("w", np.ones((4, 4), np.float32))
  writer.close()
  bad = tmp_path / "bad.safetensors"
  bad.write_bytes(damage((tmp_path / "ok.safetensors").read_bytes()))
  with pytest.raises(HFError, match=message) as e:
    st.SafetensorsFile(bad)
  assert "\n" not in str(e.value) and str(bad) in str(e.value)
