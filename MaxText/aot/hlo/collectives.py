"""The collectives of an optimized HLO module: the device groups each runs over (every form XLA prints) and the bytes
each GPU sends over NVLink inside its domain and over its NIC across domains."""

import math
import re

COLLECTIVES = (
  "all-reduce",
  "all-gather",
  "reduce-scatter",
  "all-to-all",
  "ragged-all-to-all",
  "collective-permute",
  "collective-broadcast",
)


def _iota_groups(text):
  """Groups of replica_groups=[G,S]<=[d0,d1,...]T(p0,p1,...) (the iota form)."""
  match = re.match(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
  shape = [int(x) for x in match.group(1).split(",")]
  reshape = [int(x) for x in match.group(2).split(",")]
  perm = [int(x) for x in match.group(3).split(",")] if match.group(3) else list(range(len(reshape)))
  ids = _transpose(list(range(math.prod(reshape))), reshape, perm)
  size = shape[-1]
  return [ids[i : i + size] for i in range(0, len(ids), size)]


def _transpose(flat, dims, perm):
  """Row-major `flat` of shape `dims`, transposed by `perm`, flattened again (no numpy: this module is pure text)."""
  strides = [math.prod(dims[i + 1 :]) for i in range(len(dims))]
  out_dims = [dims[p] for p in perm]
  out = []
  for index in range(math.prod(dims)):
    coords, rest = [], index
    for d in reversed(out_dims):
      coords.append(rest % d)
      rest //= d
    coords.reverse()
    out.append(flat[sum(c * strides[p] for c, p in zip(coords, perm))])
  return out


def _mesh_groups(text):
  """Groups of replica_groups=mesh['a'=4,'b'=2] {'a'} (devices over the named axes, one group per other index)."""
  match = re.match(r"mesh\[([^\]]*)\]\s*\{([^}]*)\}", text)
  axes = [(n.strip().strip("'\""), int(v)) for n, v in (a.split("=") for a in match.group(1).split(",") if "=" in a)]
  over = [a.strip().strip("'\"") for a in match.group(2).split(",") if a.strip()]
  names = [n for n, _ in axes]
  dims = [v for _, v in axes]
  perm = [i for i, n in enumerate(names) if n not in over] + [names.index(n) for n in over]
  ids = _transpose(list(range(math.prod(dims))), dims, perm)
  size = math.prod(v for n, v in axes if n in over)
  return [ids[i : i + size] for i in range(0, len(ids), size)]


def replica_groups(instr, num_devices):
  """The device groups a collective runs over (every form XLA prints), or all devices in one group."""
  attrs = instr.attributes
  match = re.search(
    r"replica_groups=(mesh\[[^\]]*\]\s*\{[^}]*\}|\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?|\{[{}\d, ]*\})", attrs
  )
  if match:
    text = match.group(1)
    if text.startswith("mesh"):
      return _mesh_groups(text)
    if text.startswith("["):
      return _iota_groups(text)
    groups = [[int(x) for x in g.split(",") if x.strip()] for g in re.findall(r"\{([\d, ]*)\}", text[1:-1])]
    groups = [g for g in groups if g]
    if groups:
      return groups
  pairs = re.search(r"source_target_pairs=\{(.*?)\}\}?", attrs)
  if pairs:
    found = [tuple(int(x) for x in p.split(",")) for p in re.findall(r"\{(\d+,\d+)\}", attrs)]
    return [list(p) for p in found if p[0] != p[1]]
  return [list(range(num_devices))]


def collective_opcode(instr):
  """'all-gather' of all-gather / all-gather-start; None for other ops."""
  base = instr.opcode[: -len("-start")] if instr.opcode.endswith("-start") else instr.opcode
  return base if base in COLLECTIVES else None


def collective_info(module, instr, num_devices, devices_per_domain):
  """{kind, data_bytes, group_size, domains, nvlink_bytes, network_bytes, wire_bytes} of a collective.

  data_bytes: its size per device (an all-reduce's input, an all-gather's output, a reduce-scatter's input, an
  all-to-all's or permute's input). What each device sends, bandwidth-optimally (NCCL's rings inside an NVLink
  domain, one exchange per GPU across domains, every GPU's own NIC busy): a group of n devices over D domains moves
  an all-gather's or reduce-scatter's S as S (D-1)/n over the network and S (n-D)/n over NVLink (D = 1: the ring's
  S (n-1)/n; D = n: all of it over the network); an all-reduce twice that; an all-to-all S (n - n/D)/n across and
  S (n/D - 1)/n inside; a permute S over the link its pairs use."""
  kind = collective_opcode(instr)
  operand_bytes = sum(a.bytes for arrays_ in module.operand_arrays(instr) for a in arrays_)
  groups = replica_groups(instr, num_devices)
  domain_of = lambda d: d // devices_per_domain
  if kind == "collective-permute":
    crossing = any(domain_of(a) != domain_of(b) for a, b in groups)
    sent = operand_bytes if groups else 0.0
    n, domains = 2 if groups else 1, 2 if crossing else 1
    nvlink, network = (0.0, sent) if crossing else (sent, 0.0)
    data = operand_bytes
  else:
    n = max(len(g) for g in groups) if groups else 1
    domains = max(len({domain_of(d) for d in g}) for g in groups) if groups else 1
    data = operand_bytes * (n if kind == "all-gather" else 1)
    if kind in ("all-to-all", "ragged-all-to-all"):
      per_domain = n / domains
      network, nvlink = data * (n - per_domain) / n, data * (per_domain - 1) / n
    else:
      times = 2 if kind == "all-reduce" else 1
      network, nvlink = times * data * (domains - 1) / n, times * data * (n - domains) / n
  return {
    "kind": kind,
    "data_bytes": data,
    "group_size": n,
    "domains": domains,
    "nvlink_bytes": nvlink,
    "network_bytes": network,
    "wire_bytes": nvlink + network,
  }
